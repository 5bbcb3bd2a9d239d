// Executor::set_profile times every op of the steps it watches (kiln_step_bench --profile): each op is counted once per
// run, fused groups under their joined names, and a profiled step computes exactly what an unprofiled one does.
#include <catch2/catch.hpp>

#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/single_runner.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

const char* kMlp = R"(
[model]
input_shape = [1, 6, 6]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
type = "dense"
units = 4
)";

// The state after `steps` Adam steps on one batch, profiled into `p` when it is given.
std::map<std::string, HostTensor> train(int steps, OpProfile* p) {
  ModelSpec m = test::model_from(kMlp, 5);
  OptimizerSpec adam;
  adam.lr = 0.01;
  auto dev = test::registry().backend("cpu")(BackendOptions{})->open(0);
  Allocator alloc(*dev, AllocatorOptions{});
  RunnerContext ctx;
  ctx.model = &m;
  ctx.optimizer = &adam;
  ctx.devices = {DeviceContext{dev.get(), &alloc}};
  ctx.global_batch = 8;
  ctx.seed = 9;
  SingleDeviceRunner r(ctx, 0);
  const Element b = test::random_batch(8, m.input_shape, 4, 3);
  Executor& ex = r.executor(8, true, false);
  ex.set_profile(p);
  for (int i = 0; i < steps; ++i) r.train_step(b, {i, 0.01f});
  ex.set_profile(nullptr);
  return r.save_state();
}

}  // namespace

TEST_CASE("a profiled step counts every op once and computes the same bits", "[executor][profile]") {
  OpProfile p;
  const auto profiled = train(3, &p);
  const auto plain = train(3, nullptr);
  REQUIRE(profiled.size() == plain.size());
  for (const auto& [name, t] : plain) {
    INFO(name);
    CHECK(profiled.at(name).data == t.data);
  }
  // Two dense layers: at least the forward products, each step.
  REQUIRE_FALSE(p.ops.empty());
  int64_t calls = 0, gemms = 0;
  for (const auto& [name, e] : p.ops) {
    INFO(name);
    CHECK(e.calls % 3 == 0);  // the same ops in every step
    CHECK(e.seconds >= 0);
    calls += e.calls;
    if (name.find("gemm") != std::string::npos) gemms += e.calls;
  }
  CHECK(gemms >= 2 * 3);
  CHECK(p.ops.count("adam_update") == 1);
  CHECK(p.ops.at("adam_update").calls == 4 * 3);  // two kernels and two biases, each step
  CHECK(calls >= 10 * 3);
}
