// Row softmax, optionally causal (attention's masked scores), and its backward. Semantics: ops.hpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/onnx_export.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity softmax_arity(OpKind k, std::string_view name, const OpAttrs& attrs) {
  const auto& a = attrs_as<SoftmaxAttrs>(name, attrs);
  check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
  const int64_t n = product(name, {a.rows, a.cols});
  if (k == OpKind::SoftmaxForward) return {{n}, {n}};
  return {{n, n}, {n}};
}

// Softmax backward reads the forward output y.
void softmax_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::SoftmaxBackward, n.attrs, {n.out[0], g.dy()});
}

void softmax_ref(OpKind kind, const SoftmaxAttrs& a, In in, Out out) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t off = r * a.cols;
    if (kind == OpKind::SoftmaxForward) {
      const float* x = in[0] + off;
      // causal: columns after r % cols are masked
      const int64_t valid = a.causal && a.cols > 0 ? r % a.cols + 1 : a.cols;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < valid; ++j) mx = std::max<double>(mx, x[j]);
      double sum = 0;
      for (int64_t j = 0; j < valid; ++j) sum += std::exp(double(x[j]) - mx);
      for (int64_t j = 0; j < valid; ++j) out[0][off + j] = static_cast<float>(std::exp(double(x[j]) - mx) / sum);
      for (int64_t j = valid; j < a.cols; ++j) out[0][off + j] = 0.f;
    } else {
      const float* y = in[0] + off;
      const float* dy = in[1] + off;
      double dot = 0;
      for (int64_t j = 0; j < a.cols; ++j) dot += double(dy[j]) * y[j];
      for (int64_t j = 0; j < a.cols; ++j) out[0][off + j] = static_cast<float>(double(y[j]) * (dy[j] - dot));
    }
  }
}

void softmax_cases(Table& t) {
  t.grad("4x7", OpKind::SoftmaxForward, SoftmaxAttrs{4, 7}, {uni(-2.f, 2.f)}, {kOut}, Check::reduction);

  struct S {
    int64_t rows, cols;
    bool large;
  };
  const S shapes[] = {{1, 1, false},    {3, 10, false},   {64, 10, false},  {5, 257, false},
                      {7, 1000, false}, {2, 4099, false}, {4096, 100, true}};
  for (const S& s : shapes) {
    const std::string v = str(s.rows) + "x" + str(s.cols);
    SoftmaxAttrs a{s.rows, s.cols};
    t.add(v, OpKind::SoftmaxForward, a, {uni(-5.f, 5.f)}, {kOut}, Check::reduction, false).large = s.large;
    t.add(v, OpKind::SoftmaxBackward, a, {uni(0.f, 1.f), kF}, {kOut}, Check::reduction, false).large = s.large;
  }

  // Attention's causal softmax over (B*H*T, T): rows = B*H*T, several blocks of T rows; the first row of each block
  // has one unmasked column. Causal rows of 2048.
  const S causal[] = {{1, 1, false},     {3, 0, false},         {4, 4, false},      {12, 3, false},
                      {3072, 64, false}, {2 * 257, 257, false}, {2048, 2048, true}, {3, 600000, true}};
  for (const S& s : causal) {
    const SoftmaxAttrs a{s.rows, s.cols, true};
    const std::string v = str(s.rows) + "x" + str(s.cols) + ".causal";
    t.add(v, OpKind::SoftmaxForward, a, {uni(-5.f, 5.f)}, {kOut}, Check::reduction, false).large = s.large;
  }
  // Backward ignores `causal`: dx = y (dy - y.dy) for any y (a causal forward's y is 0 after the diagonal).
  t.add("12x3.causal", OpKind::SoftmaxBackward, SoftmaxAttrs{12, 3, true}, {uni(0.f, 1.f), kF}, {kOut},
        Check::reduction, false);
  t.grad("10x5.causal", OpKind::SoftmaxForward, SoftmaxAttrs{10, 5, true}, {uni(-2.f, 2.f)}, {kOut}, Check::reduction);

  // Long loops (op_support.hpp): a workgroup walks each row in 64-wide steps, three passes forward, two backward.
  // Forward with equal logits: every output is 1/cols exactly, so a backend's f32 sum of 600,000 exponentials (the
  // CPU's is sequential: 7e-5 relative error on random logits) is exact, and a short loop still shows (a short sum
  // or unwritten outputs).
  for (int64_t cols : {600000, 1500000}) {
    SoftmaxAttrs a{2, cols};
    t.add("2x" + str(cols) + ".equal", OpKind::SoftmaxForward, a, {ints(0, 0)}, {kOut}, Check::reduction, false).large =
        true;
    t.add("2x" + str(cols), OpKind::SoftmaxBackward, a, {uni(0.f, 1.f), kF}, {kOut}, Check::reduction, false).large =
        true;
  }
}

// ONNX: Softmax over the last axis; a causal one adds a (T, T) mask of 0 on and below the diagonal and -inf above
// first (exactly 0 there).
void softmax_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<SoftmaxAttrs>(n.attrs);
  const Shape& xs = g.tensor(n.in[0]).shape;
  if (xs.rank() < 2 || xs[xs.rank() - 1] != a.cols) e.refuse(n, "a softmax over other than the last axis");
  std::string x = e.in(g, n, 0);
  if (a.causal) {
    if (xs[xs.rank() - 2] != a.cols) e.refuse(n, "a causal softmax over a non-square block");
    std::vector<float> mask(static_cast<size_t>(a.cols * a.cols), 0.f);
    for (int64_t r = 0; r < a.cols; ++r)
      for (int64_t c = r + 1; c < a.cols; ++c) mask[static_cast<size_t>(r * a.cols + c)] = -INFINITY;
    const std::string m = e.float_initializer("causal_mask/" + std::to_string(a.cols), {a.cols, a.cols}, mask);
    e.add(OnnxNode{"Add", {x, m}, {e.out(g, n, 0) + "/masked"}, {}});
    x = e.out(g, n, 0) + "/masked";
  }
  e.add(OnnxNode{"Softmax", {x}, {e.out(g, n, 0)}, {}}.i("axis", -1));
}

}  // namespace

KILN_CORE_OPS(softmax) {
  for (auto [k, name] :
       {std::pair{OpKind::SoftmaxForward, "softmax_forward"}, std::pair{OpKind::SoftmaxBackward, "softmax_backward"}}) {
    OpDesc d = desc<SoftmaxAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return softmax_arity(k, name, a); },
        ref_of<SoftmaxAttrs, softmax_ref>(k));
    if (k == OpKind::SoftmaxForward) d.grad = softmax_grad;
    d.cases = cases_of(k, softmax_cases);
    register_op(k, std::move(d));
  }
  register_onnx_mapping(OpKind::SoftmaxForward, softmax_onnx);
}

}  // namespace kiln::op_impl
