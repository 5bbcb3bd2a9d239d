// Mixed backends: data-parallel replicas and model-parallel slots on a CPU device and a Vulkan device (lavapipe
// on this machine). The strategies open the Vulkan device themselves when [device] opened only the CPU.
#include <catch2/catch.hpp>

#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

const char* kNet = R"(
[model]
input_shape = [1, 6, 6]
[[model.layers]]
name = "conv"
type = "conv2d"
filters = 3
kernel = 3
padding = "same"
activation = "tanh"
[[model.layers]]
name = "flat"
type = "flatten"
[[model.layers]]
name = "hidden"
type = "dense"
units = 8
activation = "tanh"
device = "vulkan:0"
[[model.layers]]
name = "logits"
type = "dense"
units = 3
device = "cpu:0"
)";

// Backends round differently (FMA, reduction order), so mixed runs are compared with a looser tolerance than
// same-backend ones (measured after 4 steps: 2.6e-6 with Adam, 2e-7 with SGD).
constexpr double kMixedTol = 2e-5;

bool have_vulkan() {
  if (!test::registry().has_backend("vulkan")) return false;
  return !test::registry().backend("vulkan")(BackendOptions{})->enumerate().empty();
}

std::map<std::string, HostTensor> on_cpu(const ModelSpec& m, const OptimizerSpec& o, int steps) {
  CpuDevices one(1);
  auto r = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 8));
  return train(*r, m, 8, steps, 3);
}

}  // namespace

TEST_CASE("data_parallel with one CPU and one Vulkan replica trains like one CPU device", "[parallel][vulkan]") {
  if (!have_vulkan()) KILN_SKIP("no Vulkan backend or device in this build: mixed-backend data parallel needs one");
  ModelSpec m = model_from(kNet);
  OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\n");
  auto ref = on_cpu(m, o, 4);
  CpuDevices cpu(1);
  // [device] opened only cpu:0; the strategy opens vulkan:0 through the registry.
  auto r =
      strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:0\", \"vulkan:0\"]\nmemory_limit = \"256MiB\"\n")
          ->create(context(m, o, cpu.ctx(), 8));
  auto plans = r->plan();
  REQUIRE(plans.size() == 2);
  CHECK(plans[1].device == "vulkan:0");
  CHECK_THAT(plans[1].notes[1], Catch::Contains("after backward"));  // no overlap across backends
  auto got = train(*r, m, 8, 4, 3);  // save_state also checks both replicas hold identical weights
  CHECK(max_abs_diff(got, ref) < kMixedTol);
}

TEST_CASE("model_parallel with layers on a CPU and a Vulkan device trains like one CPU device", "[parallel][vulkan]") {
  if (!have_vulkan()) KILN_SKIP("no Vulkan backend or device in this build: mixed-backend model parallel needs one");
  ModelSpec m = model_from(kNet);
  OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nmomentum = 0.9\n");
  auto ref = on_cpu(m, o, 4);
  CpuDevices cpu(1);
  for (const char* extra : {"", "micro_batches = 2\n"}) {
    CAPTURE(extra);
    auto r =
        strategy(std::string("[strategy]\ntype = \"model_parallel\"\n") + extra)->create(context(m, o, cpu.ctx(), 8));
    auto plans = r->plan();
    REQUIRE(plans.size() == 2);
    CHECK(plans[1].device == "vulkan:0");
    CHECK(plans[1].parameters > 0);
    CHECK(max_abs_diff(train(*r, m, 8, 4, 3), ref) < kMixedTol);
  }
}

TEST_CASE("batch_norm sync = true with one CPU and one Vulkan replica trains like one CPU device on the whole batch",
          "[parallel][vulkan][sync_bn]") {
  if (!have_vulkan()) KILN_SKIP("no Vulkan backend or device in this build: mixed-backend data parallel needs one");
  ModelSpec m = model_from(
      "[model]\ninput_shape = [2, 6, 6]\n"
      "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\nuse_bias = "
      "false\n"
      "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\nsync = true\n"
      "[[model.layers]]\nname = \"act\"\ntype = \"activation\"\nfunction = \"tanh\"\n"
      "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
  OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nmomentum = 0.9\n");
  auto ref = on_cpu(m, o, 4);
  CpuDevices cpu(1);
  auto r =
      strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:0\", \"vulkan:0\"]\nmemory_limit = \"256MiB\"\n")
          ->create(context(m, o, cpu.ctx(), 8));
  // Weights within the mixed-backend tolerance of one CPU device on all 8 rows, running statistics included.
  CHECK(max_abs_diff(train(*r, m, 8, 4, 3), ref) < kMixedTol);
}
