// End to end: a character model trained on tiny Shakespeare by the real `kiln` app, then `kiln sample`.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>

#include "test_support.hpp"

namespace {

const std::string kText = std::string(KILN_SOURCE_DIR) + "/samples/data/tinyshakespeare/input.txt";

std::string char_config(const std::string& out_dir) {
  std::ostringstream os;
  os << R"([run]
seed = 5
[device]
backend = "cpu"
[model]
input_shape = [16]
[[model.layers]]
name = "wte"
type = "embedding"
vocab = 65
dim = 24
init_std = 0.02
[[model.layers]]
name = "wpe"
type = "positional_embedding"
init_std = 0.02
[[model.layers]]
name = "fc"
type = "dense"
units = 48
activation = "gelu"
[[model.layers]]
name = "lm_head"
type = "dense"
units = 65
[optimizer]
type = "adamw"
learning_rate = 1e-2
clip_norm = 1.0
[train]
epochs = 2
batch_size = 16
steps_per_epoch = 40
progress = "lines"
output_dir = ")"
     << out_dir << R"("
[data.train]
stages = [{type = "text", path = ")"
     << kText << R"(", block_size = 16}]
[data.test]
stages = [{type = "text", path = ")"
     << kText << R"(", block_size = 16, examples_per_epoch = 64}]
)";
  return os.str();
}

}  // namespace

TEST_CASE("kiln trains a character model on tiny Shakespeare and kiln sample prints seeded text",
          "[e2e][text][sample]") {
  const auto dir = kiln::test::temp_dir("text_e2e");
  const auto cfg = dir / "char.toml";
  std::ofstream(cfg) << char_config((dir / "run").string());
  auto r = kiln::test::run_app("train " + cfg.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Per-token test loss falls from ln(65) = 4.17 (uniform) towards a bigram model's ~2.5.
  std::smatch m;
  std::string out = r.output;
  std::vector<double> test_loss;
  std::regex re("test loss ([0-9.]+), test accuracy ([0-9.]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    test_loss.push_back(std::stod((*it)[1]));
  REQUIRE(test_loss.size() == 2);
  CHECK(test_loss[1] < 3.3);
  CHECK(test_loss[1] < test_loss[0]);
  CHECK_THAT(out, Catch::Contains("grad_norm"));
  REQUIRE(std::filesystem::exists(dir / "run" / "vocab.json"));
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::string line;
  std::getline(metrics, line);
  CHECK_THAT(line, Catch::Contains("\"grad_norm\":"));

  // Same seed, same text; the prompt, then exactly --tokens characters.
  auto a = kiln::test::run_app("sample " + cfg.string() + " --prompt 'ROMEO:' --tokens 120 --seed 7");
  auto b = kiln::test::run_app("sample " + cfg.string() + " --prompt 'ROMEO:' --tokens 120 --seed 7");
  auto c = kiln::test::run_app("sample " + cfg.string() +
                               " --prompt 'ROMEO:' --tokens 120 --seed 8 --temperature 1.0 --top-k 0");
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output == b.output);
  CHECK(a.output != c.output);
  CHECK(a.output.rfind("ROMEO:", 0) == 0);
  CHECK(a.output.size() == 6 + 120 + 1);  // ASCII characters, one byte each, and the final newline
  // A prompt character outside the vocabulary, a missing checkpoint: clear errors, exit code 2.
  auto bad = kiln::test::run_app("sample " + cfg.string() + " --prompt 'Zoë' --tokens 5");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("--prompt") && Catch::Contains("position 2"));
  auto missing = kiln::test::run_app("sample " + cfg.string() + " --checkpoint " + (dir / "none.kiln").string());
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Catch::Contains("none.kiln") && Catch::Contains("does not exist"));
}

TEST_CASE("a model with two heads reports each head's loss and accuracy in the epoch line and metrics",
          "[e2e][heads]") {
  const auto dir = kiln::test::temp_dir("heads_e2e");
  const auto cfg = dir / "heads.toml";
  std::ofstream(cfg) << R"([run]
seed = 3
[model]
input_shape = [6]
[[model.layers]]
name = "trunk"
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
name = "digit"
type = "dense"
units = 3
[[model.layers]]
name = "score"
type = "dense"
units = 3
inputs = ["trunk"]
[[model.outputs]]
layer = "digit"
loss = "softmax_cross_entropy"
[[model.outputs]]
layer = "score"
loss = "softmax_cross_entropy"
weight = 0.5
[train]
epochs = 1
batch_size = 16
progress = "lines"
output_dir = ")" << (dir / "run").string()
                     << R"("
[data.train]
stages = [{type = "synthetic", shape = [6], examples = 128, classes = 3}]
[data.test]
stages = [{type = "synthetic", shape = [6], examples = 64, classes = 3, seed = 9}]
)";
  auto r = kiln::test::run_app("train " + cfg.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("(digit: train loss ") && Catch::Contains("; score: train loss ") &&
                           Catch::Contains("test accuracy"));
  CHECK_THAT(r.output, Catch::Matches("(.|\n)*batch 8/8  loss [0-9.]+ .* digit [0-9.]+  score [0-9.]+(.|\n)*"));
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::string line;
  std::getline(metrics, line);
  CHECK_THAT(line, Catch::Contains("\"train_losses\":{\"digit\":") && Catch::Contains("\"test_losses\":{\"digit\":") &&
                       Catch::Contains("\"test_accuracies\":{\"digit\":") && Catch::Contains("\"score\":"));
}

namespace {

// Rows of four features and two labels: quadrant = 2 (f0 > 0) + (f1 > 0) (4 classes), parity = f2 > 0 (0 or 1).
void write_two_label_csv(const std::filesystem::path& p, int rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::ofstream f(p);
  f << "f0,f1,f2,f3,quadrant,parity\n";
  for (int i = 0; i < rows; ++i) {
    float v[4];
    for (float& x : v) x = nd(rng);
    f << v[0] << "," << v[1] << "," << v[2] << "," << v[3] << "," << 2 * (v[0] > 0) + (v[1] > 0) << "," << (v[2] > 0)
      << "\n";
  }
}

std::string two_label_config(const std::filesystem::path& dir, const std::string& quadrant_label,
                             const std::string& parity_label,
                             const std::string& test_labels = "[\"quadrant\", \"parity\"]") {
  std::ostringstream os;
  os << R"([run]
seed = 4
[model]
input_shape = [4]
[[model.layers]]
name = "trunk"
type = "dense"
units = 32
activation = "relu"
[[model.layers]]
name = "quadrant"
type = "dense"
units = 4
[[model.layers]]
name = "parity"
type = "dense"
units = 1
inputs = ["trunk"]
[[model.outputs]]
layer = "quadrant"
loss = "softmax_cross_entropy"
label = ")"
     << quadrant_label << R"("
[[model.outputs]]
layer = "parity"
loss = "binary_cross_entropy"
label = ")"
     << parity_label << R"("
[optimizer]
type = "adam"
learning_rate = 1e-2
[train]
epochs = 6
batch_size = 32
progress = "none"
output_dir = ")"
     << (dir / "run").string() << R"("
[data.train]
stages = [{type = "csv", path = "train.csv", header = true, label = ["quadrant", "parity"]}, {type = "shuffle", buffer = 2000}]
[data.test]
stages = [{type = "csv", path = "test.csv", header = true, label = )"
     << test_labels << R"(}]
)";
  return os.str();
}

double metric(const std::string& line, const std::string& object, const std::string& head) {
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex("\"" + object + "\":\\{[^}]*\"" + head + "\":([-0-9.eE+]+)")));
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("each output trains on the label it names: two labels of a csv source, a classifier and a binary head",
          "[e2e][heads]") {
  const auto dir = kiln::test::temp_dir("named_labels");
  write_two_label_csv(dir / "train.csv", 2000, 1);
  write_two_label_csv(dir / "test.csv", 500, 2);
  SECTION("both heads learn their own label") {
    std::ofstream(dir / "run.toml") << two_label_config(dir, "quadrant", "parity");
    auto r = kiln::test::run_app("train " + (dir / "run.toml").string());
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::ifstream metrics(dir / "run" / "metrics.jsonl");
    std::string line, last;
    while (std::getline(metrics, line))
      if (line.find("\"test_accuracies\"") != std::string::npos) last = line;
    // Each head learns its own label; fed the other head's column, neither could pass chance (0.25, 0.5) by much.
    CHECK(metric(last, "test_accuracies", "quadrant") > 0.9);
    CHECK(metric(last, "test_accuracies", "parity") > 0.9);
  }

  SECTION("a label the data does not name is refused naming the key and the data's labels") {
    std::ofstream(dir / "bad.toml") << two_label_config(dir, "quadrant", "even");
    auto b = kiln::test::run_app("train " + (dir / "bad.toml").string());
    CHECK(b.exit_code == 2);
    CHECK_THAT(b.output, Catch::Contains("model.outputs[1].label") && Catch::Contains("\"even\"") &&
                             Catch::Contains("\"quadrant\", \"parity\""));
  }
  SECTION("test data whose labels come in another order is refused") {
    std::ofstream(dir / "order.toml") << two_label_config(dir, "quadrant", "parity", "[\"parity\", \"quadrant\"]");
    auto b = kiln::test::run_app("train " + (dir / "order.toml").string());
    CHECK(b.exit_code == 2);
    CHECK_THAT(b.output, Catch::Contains("same labels in the same order"));
  }
  SECTION("one output naming its label and another not is refused") {
    std::string text = two_label_config(dir, "quadrant", "parity");
    text.replace(text.find("label = \"parity\"\n"), std::string("label = \"parity\"\n").size(), "");
    std::ofstream(dir / "half.toml") << text;
    auto b = kiln::test::run_app("train " + (dir / "half.toml").string());
    CHECK(b.exit_code == 2);
    CHECK_THAT(b.output, Catch::Contains("every output must"));
  }
}
