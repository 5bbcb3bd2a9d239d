// End to end: a character model trained on tiny Shakespeare by the real `kiln` app, then `kiln sample`.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
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
output_dir = ")" << out_dir << R"("
[data.train]
stages = [{type = "text", path = ")" << kText << R"(", block_size = 16}]
[data.test]
stages = [{type = "text", path = ")" << kText << R"(", block_size = 16, examples_per_epoch = 64}]
)";
  return os.str();
}

}  // namespace

TEST_CASE("kiln trains a character model on tiny Shakespeare and kiln sample prints seeded text", "[e2e][text][sample]") {
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
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) test_loss.push_back(std::stod((*it)[1]));
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
  auto c = kiln::test::run_app("sample " + cfg.string() + " --prompt 'ROMEO:' --tokens 120 --seed 8 --temperature 1.0 --top-k 0");
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

TEST_CASE("a model with two heads reports each head's loss and accuracy in the epoch line and metrics", "[e2e][heads]") {
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
output_dir = ")" << (dir / "run").string() << R"("
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
