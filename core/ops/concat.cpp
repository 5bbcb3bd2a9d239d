// Concatenation along the middle axis of (outer, sizes[j], inner) parts, and split, its inverse.
// Semantics: ops.hpp.
// Also the concat layer that emits it.
#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity concat_arity(OpKind k, std::string_view name, const OpAttrs& attrs) {
  const auto& a = attrs_as<ConcatAttrs>(name, attrs);
  check_dims(name, {{"outer", a.outer}, {"inner", a.inner}});
  std::vector<int64_t> parts;
  int64_t total = 0;
  for (size_t j = 0; j < a.sizes.size(); ++j) {
    const std::string key = "sizes[" + std::to_string(j) + "]";
    check_dims(name, {{key.c_str(), a.sizes[j]}});
    parts.push_back(product(name, {a.outer, a.sizes[j], a.inner}));
    if (__builtin_add_overflow(total, a.sizes[j], &total)) throw Error(op_label(name) + ": sizes overflow");
  }
  const int64_t whole = product(name, {a.outer, total, a.inner});
  if (k == OpKind::Concat) return {parts, {whole}};
  return {{whole}, parts};
}

void concat_grad(GradContext& g) {
  const Node& n = g.node();
  std::vector<TensorId> parts;
  for (auto x : n.in) parts.push_back(g.grad_tensor(x));
  g.emit(OpKind::Split, n.attrs, {g.dy()}, parts);
  for (size_t i = 0; i < n.in.size(); ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

void split_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  std::vector<TensorId> parts;
  for (size_t i = 0; i < n.out.size(); ++i) {
    TensorId d = g.dy(i);
    if (d == kNoTensor) {  // an unused part contributes zeros
      d = g.grad_tensor(n.out[i]);
      g.emit(OpKind::Fill, ElementwiseAttrs{g.shape(n.out[i]).numel(), 0.f, 0.f}, {}, {d});
    }
    parts.push_back(d);
  }
  g.emit_grad(n.in[0], OpKind::Concat, n.attrs, parts);
}

// Concat copies x_j into y; Split copies y back into x_j. `whole` is y, `parts` the x_j.
void concat_split_ref(OpKind k, const ConcatAttrs& a, In in, Out out) {
  const bool concat = k == OpKind::Concat;
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  int64_t start = 0;  // first row of part j inside y
  for (size_t j = 0; j < a.sizes.size(); ++j) {
    const int64_t rows = a.sizes[j];
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < a.inner; ++i) {
          const int64_t w = (o * total + start + r) * a.inner + i;
          const int64_t p = (o * rows + r) * a.inner + i;
          if (concat)
            out[0][w] = in[j][p];
          else
            out[j][p] = in[0][w];
        }
    start += rows;
  }
}

void concat_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("2x(3,1,2)x2", OpKind::Concat, ConcatAttrs{2, 2, {3, 1, 2}}, {f, f, f}, {kOut}, Check::elementwise);
  t.grad("2x(3,1,2)x2", OpKind::Split, ConcatAttrs{2, 2, {3, 1, 2}}, {f}, {kOut, kOut, kOut}, Check::elementwise);

  struct C {
    int64_t outer, inner;
    std::vector<int64_t> sizes;
  };
  const C shapes[] = {{1, 1, {1}},       {3, 4, {2, 3}},       {2, 5, {5, 1, 7}},
                      {7, 1, {3, 0, 2}}, {1, 1000, {3, 4, 5}}, {64, 49, {16, 32}}};
  for (const C& c : shapes) {
    std::string v = str(c.outer) + "x[";
    for (size_t i = 0; i < c.sizes.size(); ++i) {
      if (i) v += ',';
      v += str(c.sizes[i]);
    }
    v += "]x";
    v += str(c.inner);
    v += ".int";
    ConcatAttrs a{c.outer, c.inner, c.sizes};
    t.add(v, OpKind::Concat, a, V(c.sizes.size(), kI), {kOut}, Check::elementwise, true);
    t.add(v, OpKind::Split, a, {kI}, V(c.sizes.size(), kOut), Check::elementwise, true);
  }
}

// ---- the layer ---------------------------------------------------------------------------------------------

class ConcatLayer : public Layer {
 public:
  explicit ConcatLayer(const ConfigNode& c) : axis_(c.get_int("axis", 0)) { c.finish(); }
  std::string type() const override { return "concat"; }
  int arity() const override { return -1; }
  // Concatenates along a per-example axis (0 = channels/features; negative counts from the end).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s0 = g.shape(in[0]);
    int64_t rank = static_cast<int64_t>(s0.rank()) - 1;
    int64_t ax = axis_ < 0 ? axis_ + rank : axis_;
    if (ax < 0 || ax >= rank)
      shape_error(g, "concat axis " + std::to_string(axis_) + " is out of range for " + s0.str());
    size_t d = static_cast<size_t>(ax + 1);
    ConcatAttrs a;
    int64_t total = 0;
    for (auto t : in) {
      const Shape& s = g.shape(t);
      if (s.rank() != s0.rank()) shape_error(g, "concat inputs differ in rank: " + s0.str() + " and " + s.str());
      for (size_t i = 0; i < s.rank(); ++i)
        if (i != d && s[i] != s0[i])
          shape_error(g, "concat inputs differ off the axis: " + s0.str() + " and " + s.str());
      a.sizes.push_back(s[d]);
      total += s[d];
    }
    a.outer = 1;
    for (size_t i = 0; i < d; ++i) a.outer *= s0[i];
    a.inner = 1;
    for (size_t i = d + 1; i < s0.rank(); ++i) a.inner *= s0[i];
    Shape out = s0;
    out[d] = total;
    check_size(g, out, "output", "the sizes of its inputs");
    return g.op1(OpKind::Concat, a, std::vector<TensorId>(in.begin(), in.end()), out);
  }

 private:
  int64_t axis_;
};

// ONNX: Concat along the axis of the output's shape that the concat's (outer, sizes, inner) describe.
void concat_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<ConcatAttrs>(n.attrs);
  const Shape& s = g.tensor(n.out[0]).shape;
  int64_t axis = -1, before = 1, total = 0;
  for (auto k : a.sizes) total += k;
  for (size_t d = 0; d < s.rank(); ++d) {
    if (before == a.outer && axis < 0 && d > 0 && s[d] == total) {
      int64_t after = 1;
      for (size_t f = d + 1; f < s.rank(); ++f) after *= s[f];
      if (after == a.inner) axis = static_cast<int64_t>(d);
    }
    before *= s[d];
  }
  if (axis < 0) e.refuse(n, "this concat");
  OnnxNode x{"Concat", {}, {e.out(g, n, 0)}, {}};
  for (size_t i = 0; i < n.in.size(); ++i) x.in.push_back(e.in(g, n, i));
  e.add(std::move(x.i("axis", axis)));
}

// ONNX, for attention's q, k, v: equal parts of axis 0, each with that axis dropped (Gather with a scalar index).
void split_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<ConcatAttrs>(n.attrs);
  const Shape& xs = g.tensor(n.in[0]).shape;
  if (a.outer != 1 || static_cast<int64_t>(n.out.size()) != xs[0])
    e.refuse(n, "a split other than into the parts of the first axis");
  for (size_t i = 0; i < n.out.size(); ++i) {
    const std::string idx = e.int64_initializer("index/" + std::to_string(i), {}, {static_cast<int64_t>(i)});
    e.add(OnnxNode{"Gather", {e.in(g, n, 0), idx}, {e.out(g, n, i)}, {}}.i("axis", 0));
  }
}

}  // namespace

KILN_CORE_OPS(concat) {
  for (auto [k, name] : {std::pair{OpKind::Concat, "concat"}, std::pair{OpKind::Split, "split"}}) {
    OpDesc d = desc<ConcatAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return concat_arity(k, name, a); },
        ref_of<ConcatAttrs, concat_split_ref>(k));
    d.grad = k == OpKind::Concat ? concat_grad : split_grad;
    d.cases = cases_of(k, concat_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("concat", factory<ConcatLayer>());
  register_onnx_mapping(OpKind::Concat, concat_onnx);
  register_onnx_mapping(OpKind::Split, split_onnx);
}

}  // namespace kiln::op_impl
