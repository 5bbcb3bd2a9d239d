// Data a run cannot use, through the real `kiln` app: labels a loss cannot use and non-finite inputs are data errors
// (exit code 2) naming the source file, the example and the value, in training and in evaluation, instead of a NaN
// loss or an accuracy over them. The pipeline's own errors: tests/unit/test_data_errors.cpp.
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <sstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

// 48 rows of 4 features and a label in [0, 3); row `bad_row` gets `bad_label` (or `bad_feature` as feature 2).
std::string write_csv(const fs::path& p, int bad_row = -1, const std::string& bad_label = "",
                      const std::string& bad_feature = "") {
  std::ofstream f(p);
  for (int r = 0; r < 48; ++r) {
    const int cls = r % 3;
    f << 0.1 * cls << "," << -0.2 * cls << "," << (r == bad_row && !bad_feature.empty() ? bad_feature : "0.5") << ","
      << 0.01 * r << "," << (r == bad_row && !bad_label.empty() ? bad_label : std::to_string(cls)) << "\n";
  }
  return p.string();
}

std::string config(const fs::path& dir, const std::string& train_csv, const std::string& test_csv,
                   const std::string& loss = "softmax_cross_entropy", int units = 3, const std::string& stage = "") {
  std::ostringstream os;
  os << "[run]\nname = \"labels\"\nseed = 1\n[device]\nbackend = \"cpu\"\nmemory_limit = \"256MiB\"\n"
     << "[model]\ninput_shape = [4]\nloss = \"" << loss << "\"\n"
     << "[[model.layers]]\ntype = \"dense\"\nunits = 8\nactivation = \"relu\"\n"
     << "[[model.layers]]\ntype = \"dense\"\nunits = " << units << "\n"
     << "[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.01\n"
     << "[train]\nepochs = 1\nbatch_size = 16\nprogress = \"none\"\noutput_dir = \"" << (dir / "out").string() << "\"\n"
     << "[data.train]\nstages = [{type = \"csv\", path = \"" << train_csv << "\"}" << stage << "]\n"
     << "[data.test]\nstages = [{type = \"csv\", path = \"" << test_csv << "\"}" << stage << "]\n";
  const fs::path cfg = dir / "run.toml";
  std::ofstream(cfg) << os.str();
  return cfg.string();
}

// --overwrite: several runs of one test share a run directory.
kiln::test::AppResult train(const std::string& cfg) { return kiln::test::run_app("train " + cfg + " --overwrite"); }

}  // namespace

TEST_CASE("a class label out of range in the training data is a data error naming the file, example and value",
          "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-train");
  const std::string good = write_csv(dir / "good.csv");
  const std::string bad = write_csv(dir / "bad.csv", 21, "7");
  auto r = train(config(dir, bad, good));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data error") && Catch::Contains("[data.train]") && Catch::Contains(bad) &&
                           Catch::Contains("example 21") && Catch::Contains("label 7") &&
                           Catch::Contains("3 classes") && Catch::Contains("[0, 3)"));
  CHECK_THAT(r.output, !Catch::Contains("loss is nan"));

  // A negative and a fractional class index are refused the same way.
  for (const char* v : {"-1", "1.5"}) {
    auto r2 = train(config(dir, write_csv(dir / "frac.csv", 5, v), good));
    INFO(v << "\n" << r2.output);
    CHECK(r2.exit_code == 2);
    CHECK_THAT(r2.output, Catch::Contains("example 5") && Catch::Contains(std::string("label ") + v));
  }
}

TEST_CASE("a class label out of range in the test data fails instead of reporting an accuracy", "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-test");
  const std::string good = write_csv(dir / "good.csv");
  const std::string bad = write_csv(dir / "bad_test.csv", 40, "12");
  auto r = train(config(dir, good, bad));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("[data.test]") && Catch::Contains(bad) && Catch::Contains("example 40") &&
                           Catch::Contains("label 12"));
  CHECK_THAT(r.output, !Catch::Contains("test accuracy"));
}

TEST_CASE("a non-finite input in the test data is a data error naming the file, example and feature",
          "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-nan");
  const std::string good = write_csv(dir / "good.csv");
  // The CSV reader refuses "nan" itself; a finite 3e38 scaled by 10 becomes inf inside the pipeline.
  const std::string bad = write_csv(dir / "big_test.csv", 9, "", "3e38");
  const std::string scale = ", {type = \"scale\", factor = 10}";
  auto r = train(config(dir, good, bad, "softmax_cross_entropy", 3, scale));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("[data.test]") && Catch::Contains(bad) && Catch::Contains("example 9") &&
                           Catch::Contains("input value inf at feature 2"));
  CHECK_THAT(r.output, !Catch::Contains("test accuracy"));
  // The same in training data.
  auto t = train(config(dir, bad, good, "softmax_cross_entropy", 3, scale));
  INFO(t.output);
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.output, Catch::Contains("[data.train]") && Catch::Contains("example 9"));
}

TEST_CASE("binary_cross_entropy targets outside [0, 1] are a data error", "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-bce");
  const std::string good = write_csv(dir / "good.csv");  // labels 0, 1, 2: the 2s are not binary targets
  auto r = train(config(dir, good, good, "binary_cross_entropy", 1));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("example 2") && Catch::Contains("label 2") && Catch::Contains("[0, 1]"));
}

TEST_CASE("valid CSV data trains and evaluates with exit code 0 and an accuracy", "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-ok");
  const std::string good = write_csv(dir / "good.csv");
  auto ok = train(config(dir, good, good));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Catch::Contains("test accuracy"));
}

TEST_CASE("softmax_cross_entropy trains on the one_hot map op's labels like on class indices, accuracy by argmax",
          "[hardening][labels]") {
  auto dir = kiln::test::temp_dir("hard-labels-onehot");
  const std::string good = write_csv(dir / "good.csv");
  auto idx = train(config(dir, good, good));
  INFO(idx.output);
  REQUIRE(idx.exit_code == 0);
  const std::string one_hot = ", {type = \"map\", ops = [{op = \"one_hot\", classes = 3}]}";
  auto hot = train(config(dir, good, good, "softmax_cross_entropy", 3, one_hot));
  INFO(hot.output);
  CHECK(hot.exit_code == 0);
  // The same run (seed, data, math): the same accuracy line.
  auto acc = [](const std::string& out) {
    auto p = out.find("final test accuracy");
    return p == std::string::npos ? std::string("none") : out.substr(p, out.find('\n', p) - p);
  };
  CHECK(acc(hot.output) == acc(idx.output));
  CHECK(acc(hot.output) != "none");
  // A test pipeline that keeps class indices while training uses one-hot labels is a data error, not a wrong accuracy.
  auto cfg = config(dir, good, good, "softmax_cross_entropy", 3, one_hot);
  {
    std::ifstream in(cfg);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto t = text.find("[data.test]");
    text = text.substr(0, t) + "[data.test]\nstages = [{type = \"csv\", path = \"" + good + "\"}]\n";
    std::ofstream(cfg) << text;
  }
  auto mixed = train(cfg);
  INFO(mixed.output);
  CHECK(mixed.exit_code == 2);
  CHECK_THAT(mixed.output, Catch::Contains("[data.test]") && Catch::Contains("has 1 label value(s)") &&
                               Catch::Contains("3-wide class probabilities"));
  // One-hot labels of the wrong width are refused before training, naming both widths.
  auto wide = train(config(dir, good, good, "softmax_cross_entropy", 4, one_hot));
  INFO(wide.output);
  CHECK(wide.exit_code == 2);
  CHECK_THAT(wide.output, Catch::Contains("(3,)") && Catch::Contains("(4,)"));  // the data's width and the head's
}
