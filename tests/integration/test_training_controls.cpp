// [train] early_stopping and [optimizer] ema_warmup through the real `kiln` app on a Fashion-MNIST subset: when a run
// stops, which weights it keeps, and the settings it refuses. ema_warmup's decay itself:
// tests/unit/test_training_controls.cpp.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test_support.hpp"

using namespace kiln;

namespace {

std::string run_config(const std::filesystem::path& out, const std::string& extra_train,
                       const std::string& extra_opt = "") {
  const std::string fm = "/usr/share/datasets/fashion-mnist/";
  return R"([run]
name = "controls"
seed = 9
[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 32
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 2e-3
)" + extra_opt +
         R"(
[train]
epochs = 10
batch_size = 32
progress = "none"
output_dir = ")" +
         out.string() + "\"\n" + extra_train + R"(
[data.train]
stages = [{type = "idx", images = ")" +
         fm + R"(train-images-idx3-ubyte.gz", labels = ")" + fm +
         R"(train-labels-idx1-ubyte.gz", limit = 320}, {type = "scale", factor = 0.00392156862745098}, {type = "batch"}]
[data.test]
stages = [{type = "idx", images = ")" +
         fm + R"(t10k-images-idx3-ubyte.gz", labels = ")" + fm +
         R"(t10k-labels-idx1-ubyte.gz", limit = 320}, {type = "scale", factor = 0.00392156862745098}, {type = "batch"}]
)";
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

size_t count_epochs(const std::filesystem::path& metrics) {
  std::ifstream f(metrics);
  size_t n = 0;
  for (std::string l; std::getline(f, l);) n += l.find("\"event\":\"epoch\"") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("early_stopping stops after patience epochs without improvement and restores the best epoch's weights",
          "[early_stopping]") {
  auto dir = test::temp_dir("early-stop");
  // min_delta = 100: no epoch after the first improves by that much, so the run stops after epoch 1 + patience.
  auto cfg = dir / "run.toml";
  std::ofstream(cfg) << run_config(
      dir / "out", "early_stopping = {metric = \"test_loss\", patience = 2, min_delta = 100.0, restore_best = true}\n");
  auto r = test::run_app("train " + cfg.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("early stopping after epoch 3") && Catch::Contains("at epoch 1") &&
                           Catch::Contains("weights are restored"));
  CHECK(count_epochs(dir / "out" / "metrics.jsonl") == 3);
  // The final checkpoint holds the best (epoch 1) weights: the same tensor bytes as checkpoint-best.kiln (the files
  // differ only in their epoch and step fields and checksum).
  const std::string fin = slurp(dir / "out" / "checkpoint.kiln"), best = slurp(dir / "out" / "checkpoint-best.kiln");
  REQUIRE(fin.size() == best.size());
  CHECK(fin.substr(32, fin.size() - 40) == best.substr(32, best.size() - 40));

  // train_loss improves every epoch here (min_delta 0): the run goes all 10 epochs.
  auto cfg2 = dir / "run2.toml";
  std::ofstream(cfg2) << run_config(dir / "out2", "early_stopping = {metric = \"train_loss\", patience = 2}\n");
  auto r2 = test::run_app("train " + cfg2.string());
  INFO(r2.output);
  CHECK(r2.exit_code == 0);
  CHECK(count_epochs(dir / "out2" / "metrics.jsonl") == 10);

  // Watching a test metric without evaluation is refused; bad values name the key.
  auto cfg3 = dir / "run3.toml";
  std::ofstream(cfg3) << run_config(dir / "out3", "evaluate = false\nearly_stopping = {metric = \"test_accuracy\"}\n");
  auto r3 = test::run_app("train " + cfg3.string());
  CHECK(r3.exit_code == 2);
  CHECK_THAT(r3.output, Catch::Contains("early_stopping watches test_accuracy"));
  auto cfg4 = dir / "run4.toml";
  std::ofstream(cfg4) << run_config(dir / "out4", "early_stopping = {metric = \"val_loss\"}\n");
  auto r4 = test::run_app("train " + cfg4.string());
  CHECK(r4.exit_code == 2);
  CHECK_THAT(r4.output, Catch::Contains("metric") && Catch::Contains("test_loss"));
}

TEST_CASE("ema_warmup is refused without ema", "[ema]") {
  auto dir = test::temp_dir("ema-warmup");
  auto cfg = dir / "run.toml";
  std::ofstream(cfg) << run_config(dir / "out", "", "ema_warmup = true\n");
  auto r = test::run_app("train " + cfg.string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("ema_warmup"));
  auto ok = dir / "ok.toml";
  std::ofstream(ok) << run_config(dir / "ok", "", "ema = 0.999\nema_warmup = true\n");
  auto r2 = test::run_app("train " + ok.string() + " --set train.epochs=1");
  INFO(r2.output);
  CHECK(r2.exit_code == 0);
}
