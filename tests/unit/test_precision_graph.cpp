// The precision policy as a graph: which tensors are 16-bit, where casts go, what the planner counts, and that a
// 16-bit step on the cpu backend computes what the float32 step computes to bf16's precision.
#include <catch2/catch.hpp>
#include <cmath>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/half.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

const char* kMlp = R"(
[model]
input_shape = [12]
[[model.layers]]
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
name = "head"
type = "dense"
units = 5
)";

// Wider layers: their activations, not the input's 16-bit copy, make the arena.
const char* kWide = R"(
[model]
input_shape = [12]
[[model.layers]]
type = "dense"
units = 256
activation = "relu"
[[model.layers]]
type = "dense"
units = 256
activation = "relu"
[[model.layers]]
type = "dense"
units = 5
)";

Graph training_graph(const ModelSpec& m, const OptimizerSpec& o, int64_t batch = 8) {
  GraphOptions go;
  go.batch = batch;
  go.optimizer = &o;
  return build_graph(m, go);
}

}  // namespace

TEST_CASE("bfloat16 policy: activations and their gradients 16-bit, parameters, their gradients and losses float32",
          "[precision]") {
  ModelSpec m = model_from(kMlp);
  m.precision.compute = DType::bf16;
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"adam\"\n");
  const Graph g = training_graph(m, o);
  int casts_of_params = 0;
  for (const auto& n : g.nodes()) {
    if (n.kind == OpKind::Cast && g.tensor(n.in[0]).role == TensorRole::parameter) {
      ++casts_of_params;
      CHECK(g.tensor(n.out[0]).dtype == DType::bf16);
    }
    if (n.kind == OpKind::Gemm && n.phase == Phase::forward) {  // both operands cast before the product
      CHECK(g.tensor(n.in[0]).dtype == DType::bf16);
      CHECK(g.tensor(n.in[1]).dtype == DType::bf16);
    }
  }
  CHECK(casts_of_params >= 2);  // each kernel once in forward (biases are added in float32 from a 16-bit x)
  for (const auto& t : g.tensors()) {
    CAPTURE(t.name, t.layer);
    if (t.role == TensorRole::parameter || t.role == TensorRole::optimizer_state || t.role == TensorRole::gradient ||
        t.role == TensorRole::loss || t.role == TensorRole::input || t.role == TensorRole::label)
      CHECK(t.dtype == DType::f32);
  }
  for (const auto& l : g.layer_outputs) CHECK(g.tensor(l.out).dtype == DType::bf16);
  // Parameter gradients come straight from the products in float32: no 16-bit copy of one exists.
  for (auto [p, grad] : g.param_grads) CHECK(g.tensor(grad).dtype == DType::f32);
}

TEST_CASE("a layer's precision = float32 keeps its outputs float32 in a bfloat16 model", "[precision]") {
  ModelSpec m = model_from(kMlp);
  m.precision.compute = DType::bf16;
  m.layers[1].precision = DType::f32;
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\n");
  const Graph g = training_graph(m, o);
  CHECK(g.tensor(g.layer_outputs[0].out).dtype == DType::bf16);
  CHECK(g.tensor(g.layer_outputs[1].out).dtype == DType::f32);
  for (const auto& n : g.nodes())
    if (n.kind == OpKind::Gemm && n.layer == "head" && n.phase == Phase::forward)
      CHECK(g.tensor(n.in[1]).dtype == DType::f32);  // no cast of the float32 layer's kernel
}

TEST_CASE("the planner counts 16-bit tensors at 2 bytes: the activation arena about halves", "[precision][planner]") {
  ModelSpec m = model_from(kWide);
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\n");
  const MemoryPlan p32 = plan_memory(training_graph(m, o, 4096), nullptr);
  m.precision.compute = DType::bf16;
  const MemoryPlan p16 = plan_memory(training_graph(m, o, 4096), nullptr);
  CAPTURE(p32.arena, p16.arena);
  CHECK(p16.arena <= p32.arena * 55 / 100);
  CHECK(p16.arena >= p32.arena * 45 / 100);
  CHECK(p16.gradients == p32.gradients);      // parameter gradients stay float32
  CHECK(storage_bytes(3, DType::bf16) == 8);  // odd lengths end on a whole 32-bit word
}

TEST_CASE("a bfloat16 training step on the cpu backend follows the float32 one to bf16's precision",
          "[precision][cpu]") {
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\n");
  std::vector<float> loss[2];
  std::map<std::string, HostTensor> state[2];
  for (int k = 0; k < 2; ++k) {
    ModelSpec m = model_from(kMlp);
    if (k == 1) m.precision.compute = DType::bf16;
    CpuDevices one(1);
    auto r = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 16));
    for (int s = 0; s < 5; ++s)
      loss[k].push_back(r->train_step(random_batch(16, m.input_shape, 5, 40u + s), {s, 0.1f}).total_loss);
    state[k] = r->save_state();
  }
  for (int s = 0; s < 5; ++s) {
    CAPTURE(s, loss[0][s], loss[1][s]);
    CHECK(std::isfinite(loss[1][s]));
    CHECK(std::abs(loss[1][s] - loss[0][s]) <= 0.02 * std::abs(loss[0][s]) + 1e-3);
  }
  // Different, though: the step really ran in bf16 (rounding moved the weights).
  CHECK(state[0].at("head.kernel").data != state[1].at("head.kernel").data);
  for (size_t i = 0; i < state[0].at("head.kernel").data.size(); ++i)
    CHECK(std::abs(state[0].at("head.kernel").data[i] - state[1].at("head.kernel").data[i]) < 0.02);
}

TEST_CASE("float16 and bfloat16 conversions round to nearest even and keep NaN and infinities", "[precision][half]") {
  CHECK(bf16_to_float(float_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)) == 1.0f);  // a tie rounds to the even neighbour
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  CHECK(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
  CHECK(f16_to_float(float_to_f16(65504.f)) == 65504.f);
  CHECK(std::isinf(f16_to_float(float_to_f16(65520.f))));  // rounds up past the largest float16
  CHECK(f16_to_float(float_to_f16(65519.f)) == 65504.f);
  CHECK(f16_to_float(float_to_f16(5.9604645e-8f)) == 5.9604645e-8f);  // the smallest subnormal
  CHECK(f16_to_float(float_to_f16(2.9e-8f)) == 0.f);                  // below half of it: zero
  CHECK(std::isnan(f16_to_float(float_to_f16(NAN))));
  CHECK(f16_to_float(float_to_f16(-1.5f)) == -1.5f);
}
