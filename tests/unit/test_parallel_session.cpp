// The parallel strategies through a real run: TOML -> Session (logical CPU devices) -> Trainer on a Fashion-MNIST
// subset, against the single-device run of the same config; and the config errors a Session reports.
#include <catch2/catch.hpp>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/session.hpp"
#include "kiln/trainer.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string run_config(const std::string& device, const std::string& strategy, const std::string& model,
                       const std::string& out) {
  return R"([run]
seed = 5
[device]
backend = "cpu"
threads = 1
memory_limit = "256MiB"
)" + device +
         strategy + R"(
[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
)" + model +
         R"(
[optimizer]
type = "adam"
learning_rate = 2e-3
[train]
epochs = 2
batch_size = 32
progress = "none"
checkpoint_every = 0
output_dir = ")" +
         out + R"("
[data.train]
stages = [
  { type = "idx", images = ")" +
         kFm + R"(train-images-idx3-ubyte.gz", labels = ")" + kFm + R"(train-labels-idx1-ubyte.gz", limit = 2000 },
  { type = "scale", factor = 0.00392156862745098 },
  { type = "shuffle", buffer = 2000 },
  { type = "batch" },
]
[data.test]
stages = [
  { type = "idx", images = ")" +
         kFm + R"(t10k-images-idx3-ubyte.gz", labels = ")" + kFm + R"(t10k-labels-idx1-ubyte.gz", limit = 1000 },
  { type = "scale", factor = 0.00392156862745098 },
  { type = "batch" },
]
)";
}

const char* kMlp = R"(
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 64
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
)";

const char* kTwoBranch = R"(
[[model.layers]]
name = "flat"
type = "flatten"
[[model.layers]]
name = "enc"
type = "dense"
units = 64
activation = "relu"
[[model.layers]]
name = "a"
type = "dense"
units = 32
activation = "relu"
inputs = ["enc"]
device = "cpu:1"
[[model.layers]]
name = "b"
type = "dense"
units = 32
activation = "tanh"
inputs = ["enc"]
device = "cpu:2"
[[model.layers]]
name = "merge"
type = "concat"
inputs = ["a", "b"]
device = "cpu:0"
[[model.layers]]
name = "logits"
type = "dense"
units = 10
)";

struct Outcome {
  TrainReport report;
  std::string log;
};

Outcome train_run(const std::string& toml) {
  auto cfg = Config::load_string(toml, "run.toml");
  Session s(cfg, test::registry());
  std::ostringstream log;
  Trainer t(s, log);
  Outcome o;
  o.report = t.run();
  o.log = log.str();
  return o;
}

}  // namespace

TEST_CASE("a data_parallel run on 2 and 4 logical CPU devices reaches the single-device accuracy", "[parallel]") {
  auto dir = test::temp_dir("par-session");
  auto single = train_run(run_config("", "", kMlp, (dir / "single").string()));
  const double acc = single.report.epochs.back().test_accuracy;
  REQUIRE(acc > 0.7);
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto dp =
        train_run(run_config("virtual_devices = " + std::to_string(n) + "\n", "[strategy]\ntype = \"data_parallel\"\n",
                             kMlp, (dir / ("dp" + std::to_string(n))).string()));
    CHECK(dp.report.epochs.back().test_accuracy == Approx(acc).margin(0.01));
    // The same global batch and seed: the first epoch's loss matches to float rounding.
    CHECK(dp.report.epochs[0].train_loss == Approx(single.report.epochs[0].train_loss).epsilon(1e-4));
    CHECK_THAT(dp.log, Catch::Contains("data_parallel: " + std::to_string(n) + " replica(s), global batch 32"));
  }
}

TEST_CASE("a model_parallel run of a two-branch model reaches the unsplit model's accuracy", "[parallel]") {
  auto dir = test::temp_dir("par-session");
  auto single = train_run(run_config("", "", kTwoBranch, (dir / "single").string()));
  int run = 0;
  for (const char* strategy :
       {"[strategy]\ntype = \"model_parallel\"\n", "[strategy]\ntype = \"model_parallel\"\nmicro_batches = 4\n"}) {
    CAPTURE(strategy);
    auto mp = train_run(
        run_config("virtual_devices = 3\n", strategy, kTwoBranch, (dir / ("mp" + std::to_string(run++))).string()));
    CHECK(mp.report.epochs.back().test_accuracy == Approx(single.report.epochs.back().test_accuracy).margin(0.01));
    CHECK_THAT(mp.log, Catch::Contains("model_parallel: 3 device(s)") && Catch::Contains("layer a (dense)"));
  }
}

TEST_CASE("parallel strategy config errors name the file and key before any device is used", "[parallel]") {
  auto dir = (test::temp_dir("par-session") / "x").string();
  auto session = [&](const std::string& device, const std::string& strategy) {
    auto cfg = Config::load_string(run_config(device, strategy, kMlp, dir), "run.toml");
    Session s(cfg, test::registry());
    s.open_devices();
    return s.strategy().plan(s.runner_context());
  };
  CHECK_THROWS_WITH(
      session("virtual_devices = 2\n", "[strategy]\ntype = \"data_parallel\"\ndevices = [1, 1]\n"),
      Catch::Contains("run.toml:") && Catch::Contains("strategy.devices") && Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(session("virtual_devices = 2\n", "[strategy]\ntype = \"data_parallel\"\ndevices = [0, 5]\n"),
                    Catch::Contains("needs 6 devices but only 2 are visible"));
  CHECK_THROWS_WITH(session("virtual_devices = 2\nvisible = [1]\n",
                            "[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:0\", \"cpu:1\"]\n"),
                    Catch::Contains("\"cpu:0\", which is not among the opened devices: 0 = cpu:1"));
  CHECK_THROWS_WITH(session("virtual_devices = 4\n", "[strategy]\ntype = \"data_parallel\"\ndevices = [0, 1, 2]\n"),
                    Catch::Contains("batch_size = 32 does not split evenly over 3 replicas"));
  CHECK_THROWS_WITH(session("virtual_devices = 2\n", "[strategy]\ntype = \"model_parallel\"\nmicro_batches = 5\n"),
                    Catch::Contains("micro_batches = 5"));
  CHECK_NOTHROW(
      session("virtual_devices = 4\n", "[strategy]\ntype = \"data_parallel\"\ndevices = [0, 1, 2]\nuneven = true\n"));
}
