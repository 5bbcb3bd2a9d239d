// Elementwise ops over `count` values: add (alpha x + beta y), mul, axpby (y = alpha x + beta y in place), scale,
// fill and copy. Semantics: ops.hpp.
// Also the add layer that emits add.
#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

void add_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<ElementwiseAttrs>(n.attrs);
  const float coef[2] = {a.alpha, a.beta};
  for (int i = 0; i < 2; ++i) {
    if (!g.needs_grad(n.in[i])) continue;
    if (coef[i] == 1.f)
      g.contribute(n.in[i], g.dy());
    else
      g.emit_grad(n.in[i], OpKind::Scale, ElementwiseAttrs{a.count, coef[i], 0.f}, {g.dy()});
  }
}

void mul_grad(GradContext& g) {
  const Node& n = g.node();
  for (int i = 0; i < 2; ++i)
    if (g.needs_grad(n.in[i])) g.emit_grad(n.in[i], OpKind::Mul, n.attrs, {g.dy(), n.in[1 - i]});
}

void scale_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  const auto& a = std::get<ElementwiseAttrs>(n.attrs);
  if (a.alpha == 1.f)
    g.contribute(n.in[0], g.dy());
  else
    g.emit_grad(n.in[0], OpKind::Scale, a, {g.dy()});
}

void copy_grad(GradContext& g) {
  if (g.needs_grad(g.node().in[0])) g.contribute(g.node().in[0], g.dy());
}

// Elementwise ops read element i of every input before writing element i, so the allowed aliasing is safe.
void elementwise_ref(OpKind k, const ElementwiseAttrs& a, In in, Out out) {
  float* y = out[0];
  for (int64_t i = 0; i < a.count; ++i) {
    switch (k) {
      case OpKind::Add:
        y[i] = a.alpha * in[0][i] + a.beta * in[1][i];
        break;
      case OpKind::Mul:
        y[i] = in[0][i] * in[1][i];
        break;
      case OpKind::Axpby:
        y[i] = a.alpha * in[0][i] + a.beta * y[i];
        break;
      case OpKind::Scale:
        y[i] = a.alpha * in[0][i];
        break;
      case OpKind::Fill:
        y[i] = a.alpha;
        break;
      case OpKind::Copy:
        y[i] = in[0][i];
        break;
      default:
        break;
    }
  }
}

void elementwise_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("30.alpha0.5.beta-2", OpKind::Add, ElementwiseAttrs{30, 0.5f, -2.f}, {f, f}, {kOut}, Check::elementwise);
  t.grad("30.alpha1.beta1", OpKind::Add, ElementwiseAttrs{30, 1.f, 1.f}, {f, f}, {kOut}, Check::elementwise);
  t.grad("30", OpKind::Mul, ElementwiseAttrs{30}, {f, f}, {kOut}, Check::elementwise);
  t.grad("30.alpha-1.5", OpKind::Scale, ElementwiseAttrs{30, -1.5f}, {f}, {kOut}, Check::elementwise);
  t.grad("30", OpKind::Copy, ElementwiseAttrs{30}, {f}, {kOut}, Check::elementwise);

  const int64_t sizes[] = {0, 1, 3, 255, 256, 257, 4099, 65537};
  for (int64_t s : sizes) {
    const std::string v = str(s);
    t.add(v + ".int", OpKind::Add, ElementwiseAttrs{s, 1.f, 1.f}, {kI, kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".alpha2.beta-3.int", OpKind::Add, ElementwiseAttrs{s, 2.f, -3.f}, {kI, kI}, {kOut}, Check::elementwise,
          true);
    t.add(v + ".int", OpKind::Mul, ElementwiseAttrs{s}, {kI, kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".alpha2.beta-1.int", OpKind::Axpby, ElementwiseAttrs{s, 2.f, -1.f}, {kI}, {kI}, Check::elementwise,
          true);
    t.add(v + ".alpha3.int", OpKind::Scale, ElementwiseAttrs{s, 3.f}, {kI}, {kOut}, Check::elementwise, true);
    t.add(v + ".value2.5", OpKind::Fill, ElementwiseAttrs{s, 2.5f}, {}, {kOut}, Check::elementwise, true);
    t.add(v + ".int", OpKind::Copy, ElementwiseAttrs{s}, {kI}, {kOut}, Check::elementwise, true);
  }
  t.add("4099.alpha0.3.beta1.7.float", OpKind::Add, ElementwiseAttrs{4099, 0.3f, 1.7f}, {kF, kF}, {kOut},
        Check::elementwise, false);
  t.add("4099.float", OpKind::Mul, ElementwiseAttrs{4099}, {kF, kF}, {kOut}, Check::elementwise, false);
  t.add("4099.alpha0.7.beta-0.2.float", OpKind::Axpby, ElementwiseAttrs{4099, 0.7f, -0.2f}, {kF}, {kF},
        Check::elementwise, false);
  t.add("4099.alpha0.1.float", OpKind::Scale, ElementwiseAttrs{4099, 0.1f}, {kF}, {kOut}, Check::elementwise, false);
  t.add("1000.inplace_a.int", OpKind::Add, ElementwiseAttrs{1000, 2.f, 1.f}, {kI, kI}, {kOut}, Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("1000.inplace_b.int", OpKind::Add, ElementwiseAttrs{1000, 1.f, -2.f}, {kI, kI}, {kOut}, Check::elementwise,
        true)
      .alias = {{0, 1}};
  t.add("1000.inplace_a.int", OpKind::Mul, ElementwiseAttrs{1000}, {kI, kI}, {kOut}, Check::elementwise, true).alias = {
      {0, 0}};
  t.add("1000.inplace_b.int", OpKind::Mul, ElementwiseAttrs{1000}, {kI, kI}, {kOut}, Check::elementwise, true).alias = {
      {0, 1}};
  t.add("1000.inplace.int", OpKind::Scale, ElementwiseAttrs{1000, -2.f}, {kI}, {kOut}, Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("4194305.int", OpKind::Add, ElementwiseAttrs{4194305, 1.f, -1.f}, {kI, kI}, {kOut}, Check::elementwise, true)
      .large = true;
  // Past 128 MiB per tensor: some devices cannot bind it (they must say so through supports()).
  t.add("33554441.int", OpKind::Copy, ElementwiseAttrs{33554441}, {kI}, {kOut}, Check::elementwise, true).large = true;
}

struct Ew {
  OpKind kind;
  const char* name;
  int inputs;
  std::vector<std::pair<int, int>> may_alias;
  void (*grad)(GradContext&);
};

// ---- the layer ---------------------------------------------------------------------------------------------

class AddLayer : public Layer {
 public:
  explicit AddLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "add"; }
  int arity() const override { return -1; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    TensorId acc = in[0];
    for (size_t i = 1; i < in.size(); ++i) {
      if (g.shape(in[i]) != g.shape(acc))
        shape_error(g, "add needs inputs of one shape, got " + g.shape(acc).str() + " and " + g.shape(in[i]).str());
      acc = g.op1(OpKind::Add, ElementwiseAttrs{g.shape(acc).numel(), 1.f, 1.f}, {acc, in[i]}, g.shape(acc));
    }
    return acc;
  }
};

// ONNX: Add (unscaled only) and Identity.
void add_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<ElementwiseAttrs>(n.attrs);
  if (a.alpha != 1.f || a.beta != 1.f) e.refuse(n, "a scaled add");
  e.add(OnnxNode{"Add", {e.in(g, n, 0), e.in(g, n, 1)}, {e.out(g, n, 0)}, {}});
}
void copy_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  e.add(OnnxNode{"Identity", {e.in(g, n, 0)}, {e.out(g, n, 0)}, {}});
}

}  // namespace

KILN_CORE_OPS(elementwise) {
  for (const Ew& e :
       {Ew{OpKind::Add, "add", 2, {{0, 0}, {0, 1}}, add_grad}, Ew{OpKind::Mul, "mul", 2, {{0, 0}, {0, 1}}, mul_grad},
        Ew{OpKind::Axpby, "axpby", 1, {}, nullptr}, Ew{OpKind::Scale, "scale", 1, {{0, 0}}, scale_grad},
        Ew{OpKind::Fill, "fill", 0, {}, nullptr}, Ew{OpKind::Copy, "copy", 1, {}, copy_grad}}) {
    OpDesc d = desc<ElementwiseAttrs>(
        e.name,
        [name = e.name, inputs = e.inputs](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<ElementwiseAttrs>(name, a);
          return {std::vector<int64_t>(static_cast<size_t>(inputs), n), {n}};
        },
        ref_of<ElementwiseAttrs, elementwise_ref>(e.kind));
    d.may_alias = e.may_alias;
    if (e.grad) d.grad = e.grad;
    d.cases = cases_of(e.kind, elementwise_cases);
    register_op(e.kind, std::move(d));
  }
  add_core_layer("add", factory<AddLayer>());
  register_onnx_mapping(OpKind::Add, add_onnx);
  register_onnx_mapping(OpKind::Copy, copy_onnx);
}

}  // namespace kiln::op_impl
