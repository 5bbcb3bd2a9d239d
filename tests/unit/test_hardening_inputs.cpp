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
