// Data whose examples or labels do not fit the model is a config error (exit 2) from `kiln plan` and `kiln train`
// before step 1, naming the data section, its file, the stage that shaped the data, the shape found, and the model key
// (with its line) it contradicts.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

// 48 rows of `features` values and a class label in [0, 3).
std::string write_csv(const fs::path& p, int features) {
  std::ofstream f(p);
  for (int r = 0; r < 48; ++r) {
    for (int j = 0; j < features; ++j) f << 0.01 * (r + j) << ",";
    f << r % 3 << "\n";
  }
  return p.string();
}

// input_shape is on line 6, loss on line 7.
std::string config(const fs::path& dir, const std::string& input_shape, const std::string& loss,
                   const std::string& train, const std::string& test = "") {
  std::ostringstream os;
  os << "[device]\nbackend = \"cpu\"\nmemory_limit = \"256MiB\"\n\n[model]\n"
     << "input_shape = " << input_shape << "\nloss = \"" << loss << "\"\n"
     << "[[model.layers]]\ntype = \"dense\"\nunits = 8\n[[model.layers]]\ntype = \"dense\"\nunits = 3\n"
     << "[train]\nbatch_size = 16\nprogress = \"none\"\noutput_dir = \"" << (dir / "out").string() << "\"\n"
     << "[data.train]\nstages = [" << train << "]\n";
  if (!test.empty()) os << "[data.test]\nstages = [" << test << "]\n";
  const fs::path cfg = dir / "run.toml";
  std::ofstream(cfg) << os.str();
  return cfg.string();
}

}  // namespace

TEST_CASE("examples that do not fit model.input_shape are refused by kiln plan and kiln train, naming the file",
          "[hardening][data_shapes]") {
  auto dir = kiln::test::temp_dir("data-shapes-input");
  const std::string csv = write_csv(dir / "four.csv", 4);
  const std::string cfg = config(dir, "[5]", "softmax_cross_entropy", "{type = \"csv\", path = \"" + csv + "\"}");
  for (const char* cmd : {"plan ", "train "}) {
    auto r = kiln::test::run_app(cmd + cfg);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("run.toml:6: key 'model.input_shape'") && Catch::Contains("(5,)") &&
                             Catch::Contains("[data.train] (csv source, path = '" + csv + "')") &&
                             Catch::Contains("examples of shape (4,)") &&
                             Catch::Contains("stages[0] (type = \"csv\")") && Catch::Contains("input_shape = [4]"));
    CHECK_THAT(r.output, !Catch::Contains("FITS") && !Catch::Contains("epoch 1"));
  }
}

TEST_CASE("a test pipeline whose examples differ from the model is named as [data.test]", "[hardening][data_shapes]") {
  auto dir = kiln::test::temp_dir("data-shapes-test");
  const std::string good = write_csv(dir / "four.csv", 4), bad = write_csv(dir / "six.csv", 6);
  const std::string cfg = config(dir, "[4]", "softmax_cross_entropy", "{type = \"csv\", path = \"" + good + "\"}",
                                 "{type = \"csv\", path = \"" + bad + "\"}, {type = \"shuffle\", buffer = 8}");
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("[data.test] (csv source, path = '" + bad + "')") &&
                           Catch::Contains("examples of shape (6,)") && Catch::Contains("stages[0] (type = \"csv\")"));
  CHECK_THAT(r.output, !Catch::Contains("epoch 1"));
}

TEST_CASE("labels that do not fit a head's loss are refused at its loss key, naming the stage that shaped them",
          "[hardening][data_shapes]") {
  auto dir = kiln::test::temp_dir("data-shapes-labels");
  const std::string csv = write_csv(dir / "four.csv", 4);
  const std::string source = "{type = \"csv\", path = \"" + csv + "\"}";
  SECTION("one-hot labels of 5 classes against a 3-way softmax head") {
    auto r =
        kiln::test::run_app("plan " + config(dir, "[4]", "softmax_cross_entropy",
                                             source + ", {type = \"map\", ops = [{op = \"one_hot\", classes = 5}]}"));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("run.toml:7: key 'model.loss'") && Catch::Contains("output 'dense_2'") &&
                             Catch::Contains("one-hot labels of shape (3,)") &&
                             Catch::Contains("labels of shape (5,)") && Catch::Contains("stages[1] (type = \"map\")") &&
                             Catch::Contains(csv));
  }
  SECTION("class indices against an mse head of 3 outputs") {
    auto r = kiln::test::run_app("train " + config(dir, "[4]", "mse", source));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("run.toml:7: key 'model.loss'") && Catch::Contains("loss mse") &&
                             Catch::Contains("targets shaped like the output, (3,)") &&
                             Catch::Contains("labels of shape ()"));
    CHECK_THAT(r.output, !Catch::Contains("epoch 1"));
  }
  SECTION("one-hot labels over the head's 3 classes are not a shape mismatch") {
    auto r =
        kiln::test::run_app("plan " + config(dir, "[4]", "softmax_cross_entropy",
                                             source + ", {type = \"map\", ops = [{op = \"one_hot\", classes = 3}]}"));
    INFO(r.output);
    CHECK_THAT(r.output, !Catch::Contains("delivers labels"));
  }
}
