// What the data can hold against what the model takes, refused by the real `kiln` app before step 1 (exit 2, no run
// directory written) or, for `kiln predict --input`, before anything is predicted, with the source, layer and key
// named.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kText = std::string(KILN_SOURCE_DIR) + "/samples/data/tinyshakespeare/input.txt";  // 65 chars
const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

// A character model over tiny Shakespeare: an embedding of `vocab` rows, then a dense head of `classes` units.
std::string char_config(const fs::path& out, int vocab, int classes, const std::string& extra_layers = "") {
  std::ostringstream os;
  os << "[model]\ninput_shape = [16]\n[[model.layers]]\ntype = \"embedding\"\nvocab = " << vocab << "\ndim = 32\n"
     << extra_layers << "[[model.layers]]\ntype = \"dense\"\nunits = " << classes << "\n"
     << "[train]\nepochs = 1\nbatch_size = 4\nsteps_per_epoch = 2\nprogress = \"lines\"\noutput_dir = \""
     << out.string() << "\"\n[data.train]\nstages = [{type = \"text\", path = \"" << kText << "\", block_size = 16}]\n";
  return os.str();
}

// An MLP on `limit` Fashion-MNIST images, with batch norm after its hidden layer when `bn`.
std::string image_config(const fs::path& out, int limit, int batch, bool bn, const std::string& batch_stage = "") {
  std::ostringstream os;
  os << "[model]\ninput_shape = [1, 28, 28]\n[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = "
        "\"dense\"\nunits = 16\n"
     << (bn ? "[[model.layers]]\ntype = \"batch_norm\"\n" : "") << "[[model.layers]]\ntype = \"dense\"\nunits = 10\n"
     << "[train]\nepochs = 1\nbatch_size = " << batch << "\nprogress = \"lines\"\noutput_dir = \"" << out.string()
     << "\"\n[data.train]\nstages = [\n  {type = \"idx\", images = \"" << kFm
     << "train-images-idx3-ubyte.gz\", labels = \"" << kFm << "train-labels-idx1-ubyte.gz\", limit = " << limit
     << "},\n  {type = \"scale\"},\n"
     << (batch_stage.empty() ? "" : "  " + batch_stage + ",\n") << "]\n";
  return os.str();
}

// A float32 .npy file (NumPy format 1.0, C order).
std::string write_npy(const fs::path& p, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  h.append(63 - (10 + h.size()) % 64, ' ');
  h += '\n';
  std::ofstream f(p, std::ios::binary);
  const uint16_t n = static_cast<uint16_t>(h.size());
  f << "\x93NUMPY" << '\x01' << '\x00';
  f.put(static_cast<char>(n & 0xff)).put(static_cast<char>(n >> 8));
  f << h;
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return p.string();
}

// Nothing of a run was started: no run directory (metrics.jsonl, checkpoint) and no step reported.
void check_no_step(const kiln::test::AppResult& r, const fs::path& out) {
  CHECK_FALSE(fs::exists(out / "metrics.jsonl"));
  CHECK_FALSE(fs::exists(out / "checkpoint.kiln"));
  CHECK_THAT(r.output, !Catch::Contains("batch 1/") && !Catch::Contains("loss is nan"));
}

}  // namespace

TEST_CASE("a text source with more characters than the embedding has rows is refused before step 1", "[datafit]") {
  const auto d = kiln::test::temp_dir("datafit_vocab");
  const auto cfg = write(d / "char.toml", char_config(d / "run", 50, 65));
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(cfg + ":5: key 'model.layers[0].vocab'") &&
                           Catch::Contains("[data.train] (text source, path = '" + kText + "')") &&
                           Catch::Contains("has 65 distinct characters (token ids 0..64)") &&
                           Catch::Contains("layer 0 'embedding_1' (type = \"embedding\") has vocab = 50 rows") &&
                           Catch::Contains("set vocab = 65 or more"));
  check_no_step(r, d / "run");
  // Every command that reads the config with its data checks it the same way.
  for (const std::string cmd : {"plan ", "evaluate "}) {
    auto p = kiln::test::run_app(cmd + cfg);
    INFO(p.output);
    CHECK(p.exit_code == 2);
    CHECK_THAT(p.output, Catch::Contains("set vocab = 65 or more"));
  }
}

TEST_CASE("a text source with more characters than the classifier has classes is refused before step 1", "[datafit]") {
  const auto d = kiln::test::temp_dir("datafit_classes");
  const auto cfg = write(d / "char.toml", char_config(d / "run", 65, 50));
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(cfg + ":9: key 'model.layers[1].units'") &&
                           Catch::Contains("its labels are class indices 0..64") &&
                           Catch::Contains("output 1 'dense_1' (softmax_cross_entropy) has 50 classes") &&
                           Catch::Contains("set units = 65 or more"));
  check_no_step(r, d / "run");
}

TEST_CASE("an epoch ending in a batch of one through batch norm is refused before step 1 with the fixes", "[datafit]") {
  const auto d = kiln::test::temp_dir("datafit_bn");
  // 17 examples in batches of 8: 8, 8, 1.
  const auto cfg = write(d / "bn.toml", image_config(d / "run", 17, 8, true));
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(cfg + ":15: key 'train.batch_size': [train] batch_size is 8") &&
                           Catch::Contains("delivers 17 examples per epoch") &&
                           Catch::Contains("every epoch ends with a batch of 1 example") &&
                           Catch::Contains("layer 'batch_norm_1' (type = \"batch_norm\")") &&
                           Catch::Contains("{type = \"batch\", drop_remainder = true}") &&
                           Catch::Contains("set [train] batch_size = 9"));
  check_no_step(r, d / "run");

  // With the pipeline's own batch stage, the fix names it.
  const auto cfg2 = write(d / "bn2.toml", image_config(d / "run2", 17, 8, true, "{type = \"batch\"}"));
  auto r2 = kiln::test::run_app("train " + cfg2);
  INFO(r2.output);
  CHECK(r2.exit_code == 2);
  CHECK_THAT(r2.output, Catch::Contains("set drop_remainder = true in [data.train] stages[2] (type = \"batch\", " +
                                        cfg2 + ":22: key 'data.train.stages[2]')"));
  check_no_step(r2, d / "run2");

  // Dropping the remainder, or a model without batch norm, trains.
  const auto ok =
      write(d / "bn_drop.toml", image_config(d / "run3", 17, 8, true, "{type = \"batch\", drop_remainder = true}"));
  auto r3 = kiln::test::run_app("train " + ok);
  INFO(r3.output);
  CHECK(r3.exit_code == 0);
  auto r4 = kiln::test::run_app("train " + write(d / "no_bn.toml", image_config(d / "run4", 17, 8, false)));
  INFO(r4.output);
  CHECK(r4.exit_code == 0);
}

TEST_CASE("a layer value that does not fit the shapes names the config file, line and key", "[datafit]") {
  const auto d = kiln::test::temp_dir("datafit_heads");
  const auto cfg =
      write(d / "heads.toml", char_config(d / "run", 65, 65, "[[model.layers]]\ntype = \"attention\"\nheads = 5\n"));
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(cfg + ":9: key 'model.layers[1].heads': layer 'attention_1' (type = "
                                             "\"attention\"): heads = 5 must divide the width 32"));
  check_no_step(r, d / "run");
}

TEST_CASE("kiln predict refuses an --input of another shape or with values the model cannot take, naming the example",
          "[datafit][predict]") {
  // Trained once for every section.
  static const fs::path d = [] {
    const auto dir = kiln::test::temp_dir("datafit_predict");
    auto t = kiln::test::run_app("train " + write(dir / "mlp.toml", image_config(dir / "run", 64, 32, false)));
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    return dir;
  }();
  const std::string cfg = (d / "mlp.toml").string();
  std::vector<float> px(3 * 784);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<float>(i % 255) / 255.f;
  auto predict = [&](const std::string& npy) {
    const fs::path out = d / (fs::path(npy).stem().string() + ".csv");
    auto r = kiln::test::run_app("predict " + cfg + " --input " + npy + " --output " + out.string());
    return std::pair{r, fs::exists(out)};
  };
  SECTION("channels last") {
    const auto npy = write_npy(d / "nhwc.npy", {3, 28, 28, 1}, px);
    auto [r, written] = predict(npy);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(written);
    CHECK_THAT(r.output, Catch::Contains(npy + ": --input holds an array of shape (3, 28, 28, 1)") &&
                             Catch::Contains("takes (N, 1, 28, 28)") && Catch::Contains("x.transpose(0, 3, 1, 2)"));
  }
  SECTION("flattened") {
    auto [r, written] = predict(write_npy(d / "flat.npy", {3, 784}, px));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(written);
    CHECK_THAT(r.output, Catch::Contains("shape (3, 784)") && Catch::Contains("x.reshape(-1, 1, 28, 28)"));
  }
  SECTION("a NaN names the first bad example and its element") {
    std::vector<float> bad = px;
    bad[784 + 3 * 28 + 4] = NAN;
    bad[2 * 784] = INFINITY;
    auto [r, written] = predict(write_npy(d / "nan.npy", {3, 1, 28, 28}, bad));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(written);
    CHECK_THAT(r.output, Catch::Contains("example 1 of --input has x[1, 0, 3, 4] = nan"));
  }
  SECTION("(N, input_shape...) and one example of input_shape are predicted") {
    auto [r, written] = predict(write_npy(d / "nchw.npy", {3, 1, 28, 28}, px));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(written);
    CHECK_THAT(r.output, Catch::Contains("predicted 3 examples"));
    auto [r1, written1] =
        predict(write_npy(d / "one.npy", {1, 28, 28}, std::vector<float>(px.begin(), px.begin() + 784)));
    INFO(r1.output);
    CHECK(r1.exit_code == 0);
    CHECK(written1);
    CHECK_THAT(r1.output, Catch::Contains("predicted 1 examples"));
  }
}

TEST_CASE("kiln predict refuses token ids outside the embedding's vocabulary, naming the example and the value",
          "[datafit][predict]") {
  const auto d = kiln::test::temp_dir("datafit_predict_ids");
  const auto cfg = write(d / "char.toml", char_config(d / "run", 65, 65));
  auto t = kiln::test::run_app("train " + cfg);
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  std::vector<float> ids(3 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i * 7 % 65);
  const fs::path good_out = d / "good.csv";
  auto good = kiln::test::run_app("predict " + cfg + " --input " + write_npy(d / "good.npy", {3, 16}, ids) +
                                  " --output " + good_out.string());
  INFO(good.output);
  CHECK(good.exit_code == 0);
  for (float v : {70.f, -1.f, 2.5f}) {
    ids[2 * 16 + 5] = v;
    const fs::path out = d / "bad.csv";
    const auto npy = write_npy(d / "bad.npy", {3, 16}, ids);
    auto r = kiln::test::run_app("predict " + cfg + " --input " + npy + " --output " + out.string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(fs::exists(out));
    std::ostringstream value;
    value << v;
    CHECK_THAT(r.output, Catch::Contains(npy + ": example 2 of --input has x[2, 5] = " + value.str()) &&
                             Catch::Contains("layer 0 'embedding_1' (type = \"embedding\", vocab = 65)") &&
                             Catch::Contains("integers in [0, 65)"));
  }
}
