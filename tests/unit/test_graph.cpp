// Graph building, autodiff, the liveness planner and the executor, on the real CPU backend. Sizes near 2^63 (units,
// filters, batch_size, input_shape) are config errors naming the key, never an overflowed plan that "fits".
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/graph.hpp"
#include "kiln/model.hpp"
#include "kiln/single_runner.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

using test::model_from;
using test::random_batch;

struct Rig {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Allocator> alloc;
  Rig() {
    dev = test::registry().backend("cpu")(BackendOptions{})->open(0);
    alloc = std::make_unique<Allocator>(*dev, AllocatorOptions{});
  }
  DeviceContext ctx() { return {dev.get(), alloc.get()}; }
};

const char* kDag = R"(
[model]
input_shape = [2, 5, 5]
[[model.layers]]
name = "conv"
type = "conv2d"
filters = 3
kernel = 3
padding = "same"
activation = "tanh"
[[model.layers]]
name = "pool"
type = "avg_pool2d"
pool = 2
padding = "same"
[[model.layers]]
name = "flat"
type = "flatten"
[[model.layers]]
name = "a"
type = "dense"
units = 4
activation = "sigmoid"
inputs = ["flat"]
[[model.layers]]
name = "b"
type = "dense"
units = 4
inputs = ["flat"]
[[model.layers]]
name = "sum"
type = "add"
inputs = ["a", "b"]
[[model.layers]]
name = "cat"
type = "concat"
inputs = ["sum", "a"]
[[model.layers]]
name = "head1"
type = "dense"
units = 3
inputs = ["cat"]
[[model.layers]]
name = "head2"
type = "dense"
units = 3
inputs = ["b"]
[[model.outputs]]
layer = "head1"
loss = "softmax_cross_entropy"
[[model.outputs]]
layer = "head2"
loss = "softmax_cross_entropy"
weight = 0.5
)";

}  // namespace

TEST_CASE("autodiff gradients of a multi-output DAG match finite differences of the loss", "[graph]") {
  Rig rig;
  ModelSpec m = model_from(kDag);
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.0;  // the update leaves the weights alone
  RunnerContext rc;
  rc.model = &m;
  rc.optimizer = &sgd;
  rc.devices = {rig.ctx()};
  rc.global_batch = 4;
  SingleDeviceRunner runner(rc, 0);
  Element batch = random_batch(4, m.input_shape, 3, 11);
  Executor& train = runner.executor(4, true, false);
  train.load_batch(batch);
  train.run({0, 0.f});
  auto& g = train.graph();
  REQUIRE(g.losses.size() == 2);
  auto total_loss = [&]() {
    EvalResult r = runner.eval_batch(batch, false);
    return double(r.losses[0] + r.losses[1]) / 4.0;
  };
  auto state = runner.save_state();
  int checked = 0;
  for (auto [p, gid] : g.param_grads) {
    const std::string name = g.tensor(p).name;
    HostTensor grad = train.read(gid);
    HostTensor w = state.at(name);
    for (size_t i = 0; i < w.data.size(); i += std::max<size_t>(1, w.data.size() / 5)) {
      const float h = 1e-2f;
      HostTensor wp = w, wm = w;
      wp.data[i] += h;
      wm.data[i] -= h;
      runner.state().write(name, wp);
      double lp = total_loss();
      runner.state().write(name, wm);
      double lm = total_loss();
      runner.state().write(name, w);
      double fd = (lp - lm) / (2 * h);
      INFO(name << "[" << i << "] analytic " << grad.data[i] << " numeric " << fd);
      CHECK(std::abs(grad.data[i] - fd) <= 2e-3 + 2e-2 * std::abs(fd));
      ++checked;
    }
  }
  CHECK(checked > 20);
  CHECK(g.param_grads.size() == 10);  // conv, a, b, head1, head2: kernel + bias each
}

TEST_CASE("the liveness plan never overlaps tensors that are alive at the same time", "[graph]") {
  ModelSpec m = model_from(kDag);
  OptimizerSpec adam;
  GraphOptions o;
  o.batch = 8;
  o.optimizer = &adam;
  Graph g = build_graph(m, o);
  MemoryPlan p = plan_memory(g, nullptr);
  CHECK(p.arena < p.activations_unplanned);  // reuse happened
  const size_t nt = g.tensors().size();
  std::vector<size_t> first(nt, SIZE_MAX), last(nt, 0);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (auto t : g.nodes()[i].in) {
      auto r = size_t(g.root(t));
      first[r] = std::min(first[r], i), last[r] = std::max(last[r], i);
    }
    for (auto t : g.nodes()[i].out) {
      auto r = size_t(g.root(t));
      first[r] = std::min(first[r], i), last[r] = std::max(last[r], i);
    }
  }
  for (auto t : g.losses) last[size_t(t)] = g.nodes().size();
  for (auto t : g.outputs) last[size_t(t)] = g.nodes().size();
  for (size_t a = 0; a < nt; ++a) {
    if (p.region[a] != Region::arena || g.tensors()[a].alias_of != kNoTensor) continue;
    for (size_t b = a + 1; b < nt; ++b) {
      if (p.region[b] != Region::arena || g.tensors()[b].alias_of != kNoTensor) continue;
      bool live_together = !(last[a] < first[b] || last[b] < first[a]);
      bool overlap =
          p.offset[a] < p.offset[b] + g.tensors()[b].bytes() && p.offset[b] < p.offset[a] + g.tensors()[a].bytes();
      INFO("tensors " << a << " and " << b);
      CHECK_FALSE((live_together && overlap));
    }
  }
  // Every parameter has exactly one gradient in the gradient region, and Adam keeps two states per parameter.
  CHECK(p.gradients == p.persistent_by_tag[size_t(MemoryTag::parameters)]);
  CHECK(p.persistent_by_tag[size_t(MemoryTag::optimizer_state)] ==
        2 * p.persistent_by_tag[size_t(MemoryTag::parameters)]);
}

TEST_CASE("measured peak of a training step matches the plan", "[graph]") {
  Rig rig;
  ModelSpec m = model_from(kDag);
  OptimizerSpec adam;
  RunnerContext rc;
  rc.model = &m;
  rc.optimizer = &adam;
  rc.devices = {rig.ctx()};
  rc.global_batch = 16;
  auto planned = SingleDeviceRunner::plan_for(rc, 0)[0].total();
  SingleDeviceRunner runner(rc, 0);
  runner.prepare(16);
  runner.train_step(random_batch(16, m.input_shape, 3, 1), {0, 1e-3f});
  size_t peak = rig.alloc->stats().peak_in_use;
  INFO("planned " << planned << " measured " << peak);
  CHECK(peak <= planned);
  CHECK(double(peak) >= 0.95 * double(planned));
}

TEST_CASE("training steps lower the loss of a learnable problem", "[graph]") {
  Rig rig;
  ModelSpec m = model_from(R"(
[model]
input_shape = [6]
[[model.layers]]
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
type = "dropout"
rate = 0.1
[[model.layers]]
type = "dense"
units = 3
)");
  OptimizerSpec adam;
  adam.lr = 0.01;
  RunnerContext rc;
  rc.model = &m;
  rc.optimizer = &adam;
  rc.devices = {rig.ctx()};
  rc.global_batch = 32;
  SingleDeviceRunner runner(rc, 0);
  // Class = argmax of the first three features.
  Element b = random_batch(32, m.input_shape, 3, 5);
  for (int64_t i = 0; i < 32; ++i) {
    const float* x = b.x.data.data() + i * 6;
    b.y.data[size_t(i)] = float(std::max_element(x, x + 3) - x);
  }
  float first = 0, last = 0;
  for (int s = 0; s < 200; ++s) {
    auto r = runner.train_step(b, {s, 0.01f});
    if (s == 0) first = r.total_loss;
    last = r.total_loss;
  }
  CHECK(first > 0.8f);
  CHECK(last < 0.2f * first);
}

TEST_CASE("learning-rate schedules follow their formulas", "[graph]") {
  OptimizerSpec o;
  o.lr = 0.1;
  o.schedule.kind = ScheduleKind::exponential;
  o.schedule.decay_rate = 0.5;
  o.schedule.decay_steps = 10;
  CHECK(o.learning_rate_at(5) == Approx(0.1 * std::pow(0.5, 0.5)));
  o.schedule.staircase = true;
  CHECK(o.learning_rate_at(15) == Approx(0.05));
  o.schedule.kind = ScheduleKind::step;
  CHECK(o.learning_rate_at(25) == Approx(0.025));
  o.schedule.kind = ScheduleKind::cosine;
  o.schedule.total_steps = 100;
  o.schedule.alpha = 0.1;
  CHECK(o.learning_rate_at(0) == Approx(0.1));
  CHECK(o.learning_rate_at(50) == Approx(0.1 * (0.1 + 0.9 * 0.5)));
  CHECK(o.learning_rate_at(200) == Approx(0.01));
}

TEST_CASE("layer shape errors name the layer and the shapes", "[graph]") {
  ModelSpec m =
      model_from("[model]\ninput_shape = [1, 4, 4]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 3\n");
  OptimizerSpec o;
  GraphOptions go;
  go.optimizer = &o;
  CHECK_THROWS_WITH(build_graph(m, go), Catch::Contains("layer 'fc'") && Catch::Contains("flatten"));
  ModelSpec m2 = model_from(
      "[model]\ninput_shape = [1, 2, 2]\n[[model.layers]]\nname = \"c\"\ntype = \"conv2d\"\nfilters = 2\nkernel = 3\n");
  CHECK_THROWS_WITH(build_graph(m2, go), Catch::Contains("layer 'c'") && Catch::Contains("(32, 1, 2, 2)"));
}

namespace {

constexpr int64_t kHuge = int64_t{1} << 62;

std::string dense_model(const std::string& units, const std::string& input = "[784]") {
  return "[model]\ninput_shape = " + input + "\n[[model.layers]]\ntype = \"dense\"\nunits = " + units + "\n";
}

kiln::Graph build(const kiln::ModelSpec& m, int64_t batch) {
  kiln::GraphOptions o;
  o.batch = batch;
  o.training = false;
  return kiln::build_graph(m, o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST_CASE("Shape::numel refuses an element count that overflows 64 bits, and fits() bounds a tensor's bytes",
          "[hardening][sizes]") {
  CHECK(Shape{1 << 20, 1 << 20}.numel() == int64_t{1} << 40);
  CHECK_THROWS_AS(Shape({kHuge, 4}).numel(), ConfigError);
  CHECK_THROWS_WITH(Shape({int64_t{1} << 40, int64_t{1} << 40}).numel(),
                    Catch::Contains("(1099511627776, 1099511627776)"));
  CHECK(Shape{32, 1, 28, 28}.fits());
  CHECK(Shape{int64_t{1} << 46}.fits());  // exactly 2^48 bytes
  CHECK_FALSE(Shape{(int64_t{1} << 46) + 1}.fits());
  CHECK_FALSE(Shape{kHuge, kHuge}.fits());  // the product overflows: not a small wrapped value
  CHECK_FALSE(Shape{int64_t{1} << 31, int64_t{1} << 31, 4}.fits());
}

TEST_CASE("dense units near 2^63 are a config error naming the key", "[hardening][sizes]") {
  // Too large on its own: refused when the model is read.
  std::string m = error_of([] { kiln::test::model_from(dense_model("9223372036854775807")); });
  CHECK_THAT(m, Catch::Contains("model.layers[0].units") && Catch::Contains("9223372036854775807"));
  // Fine alone, too large times the features or the batch: refused when the graph is built, naming the key.
  auto spec = kiln::test::model_from(dense_model("1099511627776"));  // 2^40 units x 784 features
  m = error_of([&] { build(spec, 32); });
  CHECK_THAT(m, Catch::Contains("layer 'dense_") && Catch::Contains("kernel") &&
                    Catch::Contains("model.layers[0].units") && Catch::Contains("256 TiB"));
}

TEST_CASE("batch_size near 2^63 is a config error, not an overflowed plan", "[hardening][sizes]") {
  auto spec = kiln::test::model_from(dense_model("10"));
  std::string m = error_of([&] { build(spec, kHuge); });
  CHECK_THAT(m, Catch::Contains("[train] batch_size = " + std::to_string(kHuge)) && Catch::Contains("input_shape"));
  // A batch that fits as input but whose layer output does not names the layer and the batch.
  auto wide = kiln::test::model_from(dense_model("1048576", "[1]"));  // 2^20 units
  m = error_of([&] { build(wide, int64_t{1} << 30); });
  CHECK_THAT(m, Catch::Contains("output (batch, units)") && Catch::Contains("[train] batch_size"));
  // An input shape that alone overflows is refused when the model is read.
  m = error_of([] { kiln::test::model_from(dense_model("10", "[4611686018427387904, 4]")); });
  CHECK_THAT(m, Catch::Contains("model.input_shape"));
}

TEST_CASE("conv2d filters, kernels and strides near 2^63 are config errors, not overflow", "[hardening][sizes]") {
  const std::string conv = "[model]\ninput_shape = [3, 32, 32]\nloss = \"mse\"\n[[model.layers]]\ntype = \"conv2d\"\n";
  std::string m = error_of([&] { kiln::test::model_from(conv + "filters = 4611686018427387904\n"); });
  CHECK_THAT(m, Catch::Contains("model.layers[0].filters"));
  auto spec = kiln::test::model_from(conv + "filters = 1073741824\nkernel = 1048576\npadding = \"same\"\n");
  m = error_of([&] { build(spec, 8); });
  CHECK_THAT(m, Catch::Contains("kernel (filters") && Catch::Contains("model.layers[0].filters"));
  // Huge strides with "same" padding: a 1x1 output, computed without overflow.
  auto strided = kiln::test::model_from(conv + "filters = 4\nstrides = 9223372036854775807\npadding = \"same\"\n");
  auto g = build(strided, 2);
  REQUIRE(g.outputs.size() == 1);
  CHECK(g.tensor(g.outputs[0]).shape == Shape{2, 4, 1, 1});
}

TEST_CASE("a graph refuses any tensor above the largest size, whichever layer (a plugin's too) makes it",
          "[hardening][sizes]") {
  kiln::Graph g;
  kiln::TensorInfo t;
  t.name = "huge";
  t.layer = "plugin_layer";
  t.shape = Shape{int64_t{1} << 47};
  CHECK_THROWS_WITH(g.add_tensor(t), Catch::Contains("tensor 'huge' of layer 'plugin_layer'") &&
                                         Catch::Contains("(140737488355328,)") && Catch::Contains("256 TiB"));
  t.shape = Shape{int64_t{1} << 20};
  CHECK(g.add_tensor(t) == 0);
}
