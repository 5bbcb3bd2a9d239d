// Issue 15 items 10 and 12: inputs that used to pass silently are refused where they are written, exit code 2.
#include <catch2/catch.hpp>
#include <fstream>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "test_support.hpp"

TEST_CASE("a config path that is a directory, a missing or non-directory --plugin-dir, an empty visible list and an "
          "empty input_shape are refused with exit code 2",
          "[hardening][config]") {
  auto dir = kiln::test::temp_dir("hard-inputs");
  auto r = kiln::test::run_app("train " + dir.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("expected a TOML file, found a directory"));

  r = kiln::test::run_app("--plugin-dir " + (dir / "missing").string() + " plugins");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--plugin-dir") && Catch::Contains("does not exist"));
  std::ofstream(dir / "file") << "x";
  r = kiln::test::run_app("--plugin-dir " + (dir / "file").string() + " plugins");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--plugin-dir") && Catch::Contains("is actually a file"));

  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\nvisible = []\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], examples = 8}]\n";
  r = kiln::test::run_app("plan " + (dir / "run.toml").string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("device.visible") && Catch::Contains("at least one device index"));
  r = kiln::test::run_app("plan " + (dir / "run.toml").string() + " --set 'device.visible=[0]' --set 'model.input_shape=[]'");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.input_shape") && Catch::Contains("at least one dimension"));
}

TEST_CASE("a misspelled required key is reported with the line of its table and of the misspelling",
          "[hardening][config]") {
  auto c = kiln::Config::load_string("a = 1\n[layer]\ntype = \"dense\"\n\nunitz = 2\n", "m.toml");
  std::string msg;
  try {
    c.root().table("layer")->get_int("units");
  } catch (const kiln::ConfigError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains("m.toml:2: key 'layer.units'") && Catch::Contains("'unitz' (line 5): misspelled?"));
}

TEST_CASE("kiln plan finds the largest batch and sweeps for strategies that split a batch", "[hardening][plan]") {
  auto dir = kiln::test::temp_dir("hard-plan-dp");
  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\nvirtual_devices = 2\nthreads = 1\nmemory_limit = \"64MiB\"\n"
                                  << "[strategy]\ntype = \"data_parallel\"\ndevices = [0, 1]\n"
                                  << "[model]\ninput_shape = [16]\n[[model.layers]]\ntype = \"dense\"\nunits = 4\n"
                                  << "[train]\nbatch_size = 8\noutput_dir = \"" << (dir / "out").string() << "\"\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [16], examples = 64}]\n";
  auto r = kiln::test::run_app("plan " + (dir / "run.toml").string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("largest batch size that fits: ") && !Catch::Contains("fits: 0"));
  r = kiln::test::run_app("plan " + (dir / "run.toml").string() + " --sweep --sweep-out " + (dir / "sweep").string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("batch 2: predicted") && !Catch::Contains("batch 1: predicted"));
}

TEST_CASE("progress lines show an ETA and never print the epoch's last batch twice", "[hardening][progress]") {
  auto dir = kiln::test::temp_dir("hard-progress");
  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\n"
                                  << "[model]\ninput_shape = [8]\n[[model.layers]]\ntype = \"dense\"\nunits = 10\n"
                                  << "[train]\nepochs = 1\nbatch_size = 4\nprogress = \"lines\"\nevaluate = false\n"
                                  << "output_dir = \"" << (dir / "out").string() << "\"\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [8], examples = 40}]\n";
  auto r = kiln::test::run_app("train " + (dir / "run.toml").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // 10 batches, a line every batch: batch 10/10 once, earlier lines with an ETA.
  size_t last = 0, pos = 0;
  while ((pos = r.output.find("batch 10/10", pos)) != std::string::npos) ++last, ++pos;
  CHECK(last == 1);
  CHECK_THAT(r.output, Catch::Contains("batch 5/10") && Catch::Contains(" eta "));
}
