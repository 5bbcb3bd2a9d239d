// Hardening (issue 15): malformed --set keys are config errors naming the --set (never "internal error: stoul" or
// a silently accepted key), and where a run writes is validated: a run name is one directory name under runs/,
// an output directory that is a file is a config error naming the key and the path.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kModel = "[train]\nepochs = 3\n[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\n"
                           "units = 2\n[[model.layers]]\ntype = \"dense\"\nunits = 3\n";

std::string set_error(const std::string& set) {
  try {
    kiln::Config::load_string(kModel, "run.toml", {set});
  } catch (const kiln::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

// A small run that trains in well under a second; `run` and `train` are extra lines for those tables.
std::string write_run(const fs::path& dir, const std::string& run, const std::string& train) {
  std::ofstream(dir / "run.toml") << "[run]\n" << run << "\n[device]\nbackend = \"cpu\"\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 3\n"
                                  << "[train]\nepochs = 1\nbatch_size = 8\nprogress = \"none\"\n" << train << "\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], classes = 3, "
                                     "examples = 16}]\n";
  return (dir / "run.toml").string();
}

}  // namespace

TEST_CASE("malformed --set keys are config errors naming the --set", "[hardening][paths]") {
  struct Case {
    std::string set, says;
  };
  const Case cases[] = {
      {"model.layers[abc].units=3", "the index 'abc' is not a non-negative integer"},
      {"train..epochs=2", "an empty key between dots"},
      {".train.epochs=2", "starts with '.'"},
      {"train.epochs.=2", "ends with '.'"},
      {"model.layers[0]units=3", "expected '.' or '['"},
      {"model.layers[1.units=3", "never closed"},
      {"model.layers[-1].units=3", "not a non-negative integer"},
      {"model.layers[99999999999999999999].units=3", "not a non-negative integer"},
      {"[0].units=3", "must follow a key name"},
      {"train.ep ochs=2", "unexpected character ' '"},
      {"model.layers[7].units=3", "has no element [7]"},
      {"train.epochs[0].x=3", "'epochs' is not an array"},
  };
  for (const auto& c : cases) {
    INFO(c.set);
    const std::string m = set_error(c.set);
    CHECK_THAT(m, Catch::Contains("--set") && Catch::Contains(c.says));
    CHECK_THAT(m, !Catch::Contains("stoul"));
  }
  // Well-formed paths still work, spaces around the key included.
  auto cfg = kiln::Config::load_string(kModel, "run.toml", {"model.layers[1].units=5", " train.epochs =7"});
  CHECK(cfg.root().table("model")->table_array("layers")[1].get_int("units") == 5);
  CHECK(cfg.root().table("train")->get_int("epochs") == 7);
}

TEST_CASE("a run name that is not one directory name is a config error and nothing is written outside runs/",
          "[hardening][paths]") {
  auto dir = kiln::test::temp_dir("hard-paths-name");
  const fs::path escape = dir / "escaped";
  for (const std::string name : {"../escaped", ".", "..", "", "a/b"}) {
    INFO("name = \"" << name << "\"");
    const std::string cfg = write_run(dir, "name = \"" + name + "\"", "");
    // Run from `dir`: the default output runs/<name> is relative, so "../escaped" would land in dir/escaped and
    // "." in dir/runs itself.
    const std::string cmd = "cd " + dir.string() + " && " + std::string(KILN_APP) + " train " + cfg + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    INFO(out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK_THAT(out, Catch::Contains("run.name") && Catch::Contains("one directory name"));
    CHECK_FALSE(fs::exists(dir / "runs" / "metrics.jsonl"));
    CHECK_FALSE(fs::exists(escape));
  }
}

TEST_CASE("an output directory that is a file is a config error naming the key and the path", "[hardening][paths]") {
  auto dir = kiln::test::temp_dir("hard-paths-outfile");
  const fs::path file = dir / "not_a_dir";
  std::ofstream(file) << "keep me\n";
  auto r = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + file.string() + "\""));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("train.output_dir") && Catch::Contains(file.string()) &&
                           Catch::Contains("not a directory"));
  CHECK_THAT(r.output, !Catch::Contains("internal error"));
  std::ifstream f(file);
  std::string line;
  std::getline(f, line);
  CHECK(line == "keep me");

  // A file in the middle of the path: a runtime error naming the key and the path, not "filesystem error".
  auto r2 = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + (file / "sub").string() + "\""));
  INFO(r2.output);
  CHECK(r2.exit_code != 0);
  CHECK_THAT(r2.output, Catch::Contains("train.output_dir") && Catch::Contains((file / "sub").string()));
  CHECK_THAT(r2.output, !Catch::Contains("internal error"));

  // An explicitly empty output_dir is refused too; a valid one trains.
  auto r3 = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"\""));
  CHECK(r3.exit_code == 2);
  CHECK_THAT(r3.output, Catch::Contains("train.output_dir") && Catch::Contains("is empty"));
  auto ok = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + (dir / "out").string() + "\""));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK(fs::exists(dir / "out" / "metrics.jsonl"));
}
