// The op table: complete entries for every built-in op, the call contract checked at bind time, gradient rules
// checked by finite differences, and a plugin's own op planned, differentiated and run like a built-in one.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "kiln/config.hpp"
#include "kiln/conformance.hpp"
#include "kiln/error.hpp"
#include "kiln/onnx_export.hpp"
#include "kiln/op_table.hpp"
#include "kiln/single_runner.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

struct Rig {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Allocator> alloc;
  Rig() {
    dev = test::registry().backend("cpu")(BackendOptions{})->open(0);
    alloc = std::make_unique<Allocator>(*dev, AllocatorOptions{});
  }
  DeviceContext ctx() { return {dev.get(), alloc.get()}; }
};

// y = x * x, registered as a plugin would: its gradient rule is written in terms of built-in ops.
OpKind square_op() {
  static const OpKind k = [] {
    OpDesc d;
    d.name = "test_square";
    d.attrs_index = OpAttrs(CustomAttrs{}).index();
    d.arity = [](const OpAttrs& a) -> OpArity {
      const int64_t n = std::get<CustomAttrs>(a).ints.at(0);
      return {{n}, {n}};
    };
    d.reference = [](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
      for (int64_t i = 0; i < std::get<CustomAttrs>(a).ints[0]; ++i) out[0][i] = in[0][i] * in[0][i];
    };
    d.grad = [](GradContext& g) {  // dx = 2 * (dy * x)
      const Node& n = g.node();
      if (!g.needs_grad(n.in[0])) return;
      const int64_t count = std::get<CustomAttrs>(n.attrs).ints[0];
      TensorId t = g.new_tensor(g.shape(n.in[0]));
      g.emit(OpKind::Mul, ElementwiseAttrs{count}, {g.dy(), n.in[0]}, {t});
      g.emit_grad(n.in[0], OpKind::Scale, ElementwiseAttrs{count, 2.f, 0.f}, {t});
    };
    d.cases = [] {
      OpCase c;
      c.id = "grad.33";
      c.attrs = CustomAttrs{{33}, {}};
      c.in = {uni(-2.f, 2.f)};
      c.out = {kOut};
      c.gradcheck = true;
      return std::vector<OpCase>{c};
    };
    Registry& reg = test::registry();
    reg.set_current_plugin("test_op_table");
    OpKind kind = reg.add_op(d);
    reg.add_kernel("cpu", kind, HostKernel{[](const OpCall& c) {
                     const float* x = c.in[0].host();
                     float* y = c.out[0].host();
                     for (int64_t i = 0; i < std::get<CustomAttrs>(c.attrs).ints[0]; ++i) y[i] = x[i] * x[i];
                   }});
    class Square : public Layer {
     public:
      explicit Square(bool builtin) : builtin_(builtin) {}
      std::string type() const override { return builtin_ ? "test_square_builtin" : "test_square"; }
      TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
        const Shape s = g.shape(in[0]);
        if (builtin_) return g.op1(OpKind::Mul, ElementwiseAttrs{s.numel()}, {in[0], in[0]}, s);
        return g.op1(square_op(), CustomAttrs{{s.numel()}, {}}, {in[0]}, s);
      }

     private:
      bool builtin_;
    };
    reg.add_layer("test_square", [](const ConfigNode& c) -> std::unique_ptr<Layer> {
      c.finish();
      return std::make_unique<Square>(false);
    });
    reg.add_layer("test_square_builtin", [](const ConfigNode& c) -> std::unique_ptr<Layer> {
      c.finish();
      return std::make_unique<Square>(true);
    });
    reg.set_current_plugin("core");
    return kind;
  }();
  return k;
}

std::vector<float> train_losses(const std::string& square_type) {
  Rig rig;
  ModelSpec m = test::model_from(R"(
[model]
input_shape = [6]
[[model.layers]]
name = "d1"
type = "dense"
units = 8
[[model.layers]]
name = "sq"
type = ")" + square_type + R"("
[[model.layers]]
name = "d2"
type = "dense"
units = 3
)");
  OptimizerSpec adam;
  adam.lr = 0.01;
  RunnerContext rc;
  rc.model = &m;
  rc.optimizer = &adam;
  rc.devices = {rig.ctx()};
  rc.global_batch = 16;
  SingleDeviceRunner runner(rc, 0);
  Element b = test::random_batch(16, m.input_shape, 3, 11);
  std::vector<float> losses;
  for (int s = 0; s < 60; ++s) losses.push_back(runner.train_step(b, {s, 0.01f}).total_loss);
  return losses;
}

}  // namespace

TEST_CASE("every built-in op has a complete table entry whose name finds it again", "[op_table]") {
  std::set<std::string> names;
  for (size_t k = 0; k < kBuiltinOpCount; ++k) {
    const OpDesc& d = op_desc(static_cast<OpKind>(k));
    INFO("op kind " << k << " " << d.name);
    CHECK(!d.name.empty());
    CHECK(d.arity);
    CHECK(d.reference);
    CHECK(d.key);
    CHECK(names.insert(d.name).second);
    CHECK(find_op(d.name) == static_cast<OpKind>(k));
    CHECK(bool(d.patch) == (d.step_scalars != kStepNone));
    for (auto [o, i] : d.may_alias) CHECK((o >= 0 && i >= 0));
  }
  CHECK(op_desc(OpKind::SoftmaxCrossEntropy).is_loss);
  CHECK(!op_desc(OpKind::Gemm).is_loss);
  CHECK_THROWS_AS(op_desc(static_cast<OpKind>(60000)), Error);
  CHECK(op_name(static_cast<OpKind>(60000)) == "unknown_op");
}

TEST_CASE("check_call rejects wrong buffer counts, short buffers, wrong attributes and forbidden overlaps",
          "[op_table]") {
  Block block{nullptr, nullptr, 4096, 1};
  auto view = [&](size_t offset, size_t floats) { return BufferView{&block, offset, floats * sizeof(float)}; };
  OpCall c;
  c.kind = OpKind::Gemm;
  c.attrs = GemmAttrs{4, 4, 4};
  c.in = {view(0, 16)};
  c.out = {view(256, 16)};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("here op gemm") && Catch::Contains("expected 2 inputs"));
  c.in = {view(0, 16), view(512, 8)};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("input 1") && Catch::Contains("expected 64 bytes"));
  c.in = {view(0, 16), view(512, 16)};
  CHECK_NOTHROW(check_call(c, "here"));
  c.out = {view(0, 16)};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("overlaps input 0"));
  c.out = {view(4048, 16)};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("-byte block"));
  c.out = {view(258, 16)};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("not a multiple of 4"));
  c.out = {view(256, 16)};
  c.attrs = ConvAttrs{};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("attributes of the wrong type"));
  c.attrs = GemmAttrs{int64_t(1) << 40, int64_t(1) << 40, 4};
  CHECK_THROWS_WITH(check_call(c, "here"), Catch::Contains("overflows"));

  OpCall conv;
  conv.kind = OpKind::Conv2dForward;
  conv.attrs = ConvAttrs{1, 1, 4, 4, 1, 3, 3, 0, 1, 1, 1, 4, 4};
  conv.in = {view(0, 16), view(512, 9)};
  conv.out = {view(1024, 16)};
  CHECK_THROWS_WITH(check_call(conv, "here"), Catch::Contains("strides must be >= 1"));

  // Allowed by the table: in-place relu and add; SGD without momentum ignores v (it may be w).
  OpCall relu{OpKind::ActivationForward, ActivationAttrs{Activation::relu, 16}, {view(0, 16)}, {view(0, 16)}, {}};
  CHECK_NOTHROW(check_call(relu, "here"));
  OpCall relu_partial = relu;
  relu_partial.out = {view(8, 16)};
  CHECK_THROWS_WITH(check_call(relu_partial, "here"), Catch::Contains("overlaps input 0"));
  OpCall add{OpKind::Add, ElementwiseAttrs{16}, {view(0, 16), view(512, 16)}, {view(512, 16)}, {}};
  CHECK_NOTHROW(check_call(add, "here"));
  OpCall sgd{OpKind::SgdUpdate, SgdAttrs{16, 0.1f, 0.f}, {view(512, 16)}, {view(0, 16), view(0, 16)}, {}};
  CHECK_NOTHROW(check_call(sgd, "here"));
  std::get<SgdAttrs>(sgd.attrs).momentum = 0.9f;
  CHECK_THROWS_WITH(check_call(sgd, "here"), Catch::Contains("outputs 0 and 1 overlap"));
}

TEST_CASE("every gradient rule, built-in or a plugin's, has a finite-difference case and passes it", "[op_table]") {
  square_op();
  std::map<OpKind, int> checked;
  for (const OpCase& c : conformance_cases()) {
    if (!c.gradcheck) continue;
    INFO("case " << c.id);
    CHECK(check_gradient(c) == "");
    ++checked[c.kind];
  }
  for (size_t k = 0; k < op_count(); ++k) {
    const OpDesc& d = op_desc(static_cast<OpKind>(k));
    if (!d.grad) continue;
    INFO("op " << d.name << " has a gradient rule and no case marked gradcheck");
    CHECK(checked[static_cast<OpKind>(k)] > 0);
  }
  // relu, max pooling, dropout and every loss among them
  for (OpKind k : {OpKind::ActivationForward, OpKind::MaxPoolForward, OpKind::DropoutForward, OpKind::MeanSquaredError,
                   OpKind::BinaryCrossEntropy, OpKind::SoftmaxCrossEntropy})
    CHECK(checked[k] > 0);
}

TEST_CASE("the finite-difference check fails a wrong gradient rule", "[op_table]") {
  // Copy whose rule scales by 3: the check must name the input and both values.
  OpDesc d = op_desc(OpKind::Copy);
  d.name = "test_wrong_copy";
  d.cases = nullptr;  // copy's own cases, which this wrong rule would fail in any later conformance run
  d.grad = [](GradContext& g) {
    const Node& n = g.node();
    g.emit_grad(n.in[0], OpKind::Scale, ElementwiseAttrs{g.shape(n.in[0]).numel(), 3.f, 0.f}, {g.dy()});
  };
  d.plugin = "test_op_table";
  const OpKind k = register_op(d);
  OpCase c;
  c.id = "test_wrong_copy/10";
  c.kind = k;
  c.attrs = ElementwiseAttrs{10};
  c.in = {uni(-1.f, 1.f)};
  c.out = {kOut};
  const std::string why = check_gradient(c);
  CHECK_THAT(why, Catch::Contains("input 0") && Catch::Contains("finite differences"));
  c.kind = OpKind::Copy;
  CHECK(check_gradient(c) == "");
}

TEST_CASE("the ops kiln export --format onnx maps register their ONNX mapping with the op, and others have none",
          "[op_table]") {
  for (OpKind k :
       {OpKind::Gemm, OpKind::BatchedGemm, OpKind::Conv2dForward, OpKind::BiasAdd, OpKind::MaxPoolForward,
        OpKind::AvgPoolForward, OpKind::ActivationForward, OpKind::SoftmaxForward, OpKind::LayerNormForward,
        OpKind::BatchNormForward, OpKind::Permute, OpKind::Split, OpKind::Concat, OpKind::Add, OpKind::Copy,
        OpKind::EmbeddingForward, OpKind::SoftmaxCrossEntropy, OpKind::MeanSquaredError, OpKind::BinaryCrossEntropy}) {
    INFO(op_name(k));
    CHECK(find_onnx_mapping(k) != nullptr);
  }
  // A backward op (never in an inference graph) and rms_norm (no ONNX form in this exporter) have none.
  CHECK(find_onnx_mapping(OpKind::Conv2dBackwardData) == nullptr);
  CHECK(find_onnx_mapping(*find_op("rms_norm_forward")) == nullptr);
  CHECK_THROWS_WITH(register_onnx_mapping(OpKind::Gemm, nullptr), Catch::Contains("empty mapping"));
  CHECK_THROWS_AS(register_onnx_mapping(static_cast<OpKind>(60000), [](OnnxEmitter&, const Graph&, const Node&) {}),
                  Error);
}

TEST_CASE("register_op refuses built-in names, names taken by another plugin and incomplete descriptors",
          "[op_table]") {
  square_op();
  OpDesc d = op_desc(square_op());
  CHECK(register_op(d) == square_op());  // the same plugin again: the same kind
  d.plugin = "someone_else";
  CHECK_THROWS_WITH(register_op(d), Catch::Contains("already registered by plugin 'test_op_table'"));
  d.name = "gemm";
  CHECK_THROWS_WITH(register_op(d), Catch::Contains("is a built-in op"));
  d.name = "Bad Name";
  CHECK_THROWS_WITH(register_op(d), Catch::Contains("lower-case"));
  d.name = "test_no_reference";
  d.reference = nullptr;
  CHECK_THROWS_WITH(register_op(d), Catch::Contains("no reference"));
}

TEST_CASE("a plugin's op trains exactly like the same computation from built-in ops", "[op_table]") {
  square_op();
  const std::vector<float> custom = train_losses("test_square");
  const std::vector<float> builtin = train_losses("test_square_builtin");
  REQUIRE(custom.size() == builtin.size());
  for (size_t i = 0; i < custom.size(); ++i) {
    INFO("step " << i);
    CHECK(custom[i] == builtin[i]);
  }
  CHECK(custom.back() < 0.5f * custom.front());
}

TEST_CASE("a backend without a kernel for a plugin's op says which kernels exist", "[op_table]") {
  square_op();
  Rig rig;
  OpDesc d = op_desc(square_op());
  d.name = "test_vulkan_only";
  d.cases = nullptr;
  const OpKind k = register_op(d);
  register_kernel("vulkan", k, ShaderKernel{"test.none", {0x07230203u, 0, 0, 0, 0}, nullptr, nullptr});
  const Support s = rig.dev->supports(k, CustomAttrs{{4}, {}});
  CHECK(!s.yes);
  CHECK_THAT(s.reason, Catch::Contains("test_vulkan_only") && Catch::Contains("no cpu kernel") &&
                           Catch::Contains("kernels exist for: vulkan"));
  CHECK(rig.dev->supports(square_op(), CustomAttrs{{4}, {}}).yes);
}
