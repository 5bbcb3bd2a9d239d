// Per-channel bias: bias_add (y = x + b over (outer, channels, inner)) and bias_grad (db, its gradient).
// Semantics: ops.hpp.
#include "kiln/onnx_export.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity bias_arity(OpKind k, const OpAttrs& attrs) {
  const std::string_view op = k == OpKind::BiasAdd ? "bias_add" : "bias_grad";
  const auto& a = attrs_as<BiasAttrs>(op, attrs);
  check_dims(op, {{"outer", a.outer}, {"channels", a.channels}, {"inner", a.inner}});
  const int64_t all = product(op, {a.outer, a.channels, a.inner});
  if (k == OpKind::BiasAdd) return {{all, a.channels}, {all}};
  return {{all}, {a.channels}};
}

void bias_add_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.contribute(n.in[0], g.dy());
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::BiasGrad, n.attrs, {g.dy()});
}

void bias_add_ref(const BiasAttrs& a, In in, Out out) {
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t c = 0; c < a.channels; ++c)
      for (int64_t i = 0; i < a.inner; ++i) {
        const int64_t idx = (o * a.channels + c) * a.inner + i;
        out[0][idx] = in[0][idx] + in[1][c];
      }
}

void bias_grad_ref(const BiasAttrs& a, In in, Out out) {
  for (int64_t c = 0; c < a.channels; ++c) {
    double acc = 0;
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t i = 0; i < a.inner; ++i) acc += in[0][(o * a.channels + c) * a.inner + i];
    out[0][c] = static_cast<float>(acc);
  }
}

void bias_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("3x4x5", OpKind::BiasAdd, BiasAttrs{3, 4, 5}, {f, f}, {kOut}, Check::elementwise);

  struct B {
    int64_t outer, channels, inner;
    bool large;
  };
  const B shapes[] = {{1, 1, 1, false},      {2, 3, 5, false},   {64, 10, 1, false},  {8, 16, 49, false},
                      {1, 1, 100000, false}, {3, 300, 7, false}, {32, 64, 1024, true}};
  for (const B& b : shapes) {
    const std::string v = str(b.outer) + "x" + str(b.channels) + "x" + str(b.inner);
    BiasAttrs a{b.outer, b.channels, b.inner};
    t.add(v + ".int", OpKind::BiasAdd, a, {kI, kI}, {kOut}, Check::elementwise, true).large = b.large;
    t.add(v + ".int", OpKind::BiasGrad, a, {kI}, {kOut}, Check::reduction, true).large = b.large;
  }
  t.add("8x16x49.inplace.int", OpKind::BiasAdd, BiasAttrs{8, 16, 49}, {kI, kI}, {kOut}, Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("8x16x49.float", OpKind::BiasGrad, BiasAttrs{8, 16, 49}, {kF}, {kOut}, Check::reduction, false);
  t.add("1x1x100000.float", OpKind::BiasGrad, BiasAttrs{1, 1, 100000}, {kF}, {kOut}, Check::reduction, false);
  t.add("1x2x2200000.int", OpKind::BiasGrad, BiasAttrs{1, 2, 2200000}, {kI}, {kOut}, Check::reduction, true).large =
      true;

  // Long loops (op_support.hpp): one workgroup or one invocation per channel.
  t.add("1x3x4200001.int", OpKind::BiasGrad, BiasAttrs{1, 3, 4200001}, {kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("70000x2x1.int", OpKind::BiasGrad, BiasAttrs{70000, 2, 1}, {kI}, {kOut}, Check::reduction, true);
  t.add("40x9000x30.int", OpKind::BiasGrad, BiasAttrs{40, 9000, 30}, {kI}, {kOut}, Check::reduction, true).large = true;
}

// ONNX: the third input of the Gemm or Conv before it, when nothing else reads their output; else Add, the bias
// reshaped to broadcast over the trailing dims.
void bias_add_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<BiasAttrs>(n.attrs);
  std::string b = e.in(g, n, 1);
  OnnxNode* prev = e.fold_target(n.in[0]);
  if (prev != nullptr && prev->in.size() == 2 && (prev->op == "Gemm" || prev->op == "Conv") &&
      g.tensor(n.in[1]).shape.rank() == 1) {
    prev->in.push_back(b);
    prev->out[0] = e.out(g, n, 0);
    return;
  }
  if (a.inner > 1) {  // (C) -> (C, 1, ..., 1)
    std::vector<int64_t> dims{a.channels};
    dims.resize(g.tensor(n.in[0]).shape.rank() - 1, 1);
    e.add(OnnxNode{"Reshape", {b, e.int64s(b + "/bshape", dims)}, {b + "/b"}, {}});
    b += "/b";
  }
  e.add(OnnxNode{"Add", {e.in(g, n, 0), b}, {e.out(g, n, 0)}, {}});
}

}  // namespace

KILN_CORE_OPS(bias) {
  {
    OpDesc d = desc<BiasAttrs>(
        "bias_add", [](const OpAttrs& a) { return bias_arity(OpKind::BiasAdd, a); }, ref_of<BiasAttrs, bias_add_ref>());
    d.may_alias = {{0, 0}};
    d.grad = bias_add_grad;
    d.cases = cases_of(OpKind::BiasAdd, bias_cases);
    register_op(OpKind::BiasAdd, std::move(d));
  }
  OpDesc d = desc<BiasAttrs>(
      "bias_grad", [](const OpAttrs& a) { return bias_arity(OpKind::BiasGrad, a); },
      ref_of<BiasAttrs, bias_grad_ref>());
  d.cases = cases_of(OpKind::BiasGrad, bias_cases);
  register_op(OpKind::BiasGrad, std::move(d));
  register_onnx_mapping(OpKind::BiasAdd, bias_add_onnx);
}

}  // namespace kiln::op_impl
