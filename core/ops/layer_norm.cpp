// Layer normalization over the last axis of (rows, cols), with gamma and an optional beta; forward saves each row's
// mean and rstd for the backward op. Semantics: ops.hpp. Also the layer_norm layer that emits it.
#include <algorithm>
#include <cmath>

#include "kiln/config.hpp"
#include "kiln/layer.hpp"
#include "kiln/onnx_export.hpp"
#include "kiln/plugin.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity layer_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<LayerNormAttrs>(op, attrs);
  check_dims(op, {{"rows", a.rows}, {"cols", a.cols}});
  if (!(a.eps > 0.f) || !std::isfinite(a.eps))
    throw Error(op_label(op) + ": eps must be positive and finite, found " + std::to_string(a.eps));
  const int64_t n = product(op, {a.rows, a.cols});
  if (k == OpKind::LayerNormForward) {
    OpArity r{{n, a.cols}, {n, a.rows, a.rows}};
    if (a.bias) r.in.push_back(a.cols);
    return r;
  }
  OpArity r{{n, a.cols, a.rows, a.rows, n}, {n, a.cols}};
  if (a.bias) r.out.push_back(a.cols);
  return r;
}

void layer_norm_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<LayerNormAttrs>(n.attrs);
  std::vector<TensorId> parts;
  const size_t params = a.bias ? 3 : 2;
  for (size_t i = 0; i < params; ++i) parts.push_back(g.grad_tensor(n.in[i]));
  g.emit(OpKind::LayerNormBackward, n.attrs, {n.in[0], n.in[1], n.out[1], n.out[2], g.dy()}, parts);
  for (size_t i = 0; i < params; ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

void layer_norm_ref(OpKind kind, const LayerNormAttrs& a, In in, Out out) {
  const int64_t rows = a.rows, cols = a.cols;
  const float* gamma = in[1];
  if (kind == OpKind::LayerNormForward) {
    const float* beta = a.bias ? in[2] : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in[0] + r * cols;
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += x[c];
      const double mean = cols ? sum / double(cols) : 0.0;
      double sq = 0;
      for (int64_t c = 0; c < cols; ++c) sq += (x[c] - mean) * (x[c] - mean);
      const double rstd = 1.0 / std::sqrt((cols ? sq / double(cols) : 0.0) + double(a.eps));
      for (int64_t c = 0; c < cols; ++c) {
        double y = (x[c] - mean) * rstd * gamma[c];
        if (beta) y += beta[c];
        out[0][r * cols + c] = static_cast<float>(y);
      }
      out[1][r] = static_cast<float>(mean);
      out[2][r] = static_cast<float>(rstd);
    }
    return;
  }
  const float *mean = in[2], *rstd = in[3];
  std::vector<double> dgamma(static_cast<size_t>(cols)), dbeta(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0] + r * cols;
    const float* dy = in[4] + r * cols;
    const double m = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * rs, g = double(dy[c]) * gamma[c];
      sg += g;
      sgx += g * xhat;
      dgamma[size_t(c)] += double(dy[c]) * xhat;
      dbeta[size_t(c)] += dy[c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * rs, g = double(dy[c]) * gamma[c];
      out[0][r * cols + c] = static_cast<float>(rs * (g - sg / double(cols) - xhat * sgx / double(cols)));
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    out[1][c] = static_cast<float>(dgamma[size_t(c)]);
    if (a.bias) out[2][c] = static_cast<float>(dbeta[size_t(c)]);
  }
}

// Rows from 1 to 100,003 values (long reductions within one row), and 70,000 rows (long column sums of the
// parameter gradients); with and without beta.
void layer_norm_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("3x5", OpKind::LayerNormForward, LayerNormAttrs{3, 5, 1e-5f, true}, {f, uni(0.5f, 1.5f), f},
         {kOut, kOut, kOut}, Check::reduction);
  t.grad("4x6.nobias", OpKind::LayerNormForward, LayerNormAttrs{4, 6, 1e-5f, false}, {f, uni(0.5f, 1.5f)},
         {kOut, kOut, kOut}, Check::reduction);

  struct S {
    int64_t rows, cols;
  };
  const S shapes[] = {{1, 1}, {1, 7}, {3, 64}, {5, 65}, {17, 255}, {64, 128}, {2, 40000}, {1, 100003}, {70000, 3}};
  const Gen mean = uni(-0.5f, 0.5f), rstd = uni(0.5f, 2.f), gamma = uni(0.5f, 1.5f);
  for (const S& sh : shapes)
    for (bool bias : {true, false}) {
      const LayerNormAttrs a{sh.rows, sh.cols, 1e-5f, bias};
      const std::string v = str(sh.rows) + "x" + str(sh.cols) + (bias ? "" : ".nobias");
      V fin{kF, gamma};
      if (bias) fin.push_back(kF);
      t.add(v, OpKind::LayerNormForward, a, fin, {kOut, kOut, kOut}, Check::reduction, false);
      V out{kOut, kOut};
      if (bias) out.push_back(kOut);
      t.add(v, OpKind::LayerNormBackward, a, {kF, gamma, mean, rstd, kF}, out, Check::reduction, false);
    }
}

// ---- the layer ----------------------------------------------------------------------------------------------

// PyTorch's nn.LayerNorm(last_dim, eps, bias): normalizes over the last dimension, then scales by gamma (ones at
// start) and shifts by beta (zeros; none with use_bias = false, as nanoGPT's LayerNorm(bias=False)).
class LayerNormLayer : public Layer {
 public:
  explicit LayerNormLayer(const ConfigNode& c)
      : eps_(c.get_float("epsilon", 1e-5)), use_bias_(c.get_bool("use_bias", true)) {
    if (!(eps_ > 0) || !std::isfinite(eps_) || eps_ > 1)
      c.fail("epsilon", "expected a small positive number such as 1e-5 (PyTorch's default)");
    c.finish();
  }
  std::string type() const override { return "layer_norm"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() < 2)
      throw ConfigError("layer '" + g.layer() + "': layer_norm expects input (batch, ..., features), got " + s.str());
    const int64_t cols = s[s.rank() - 1];
    LayerNormAttrs a{s.numel() / std::max<int64_t>(cols, 1), cols, static_cast<float>(eps_), use_bias_};
    std::vector<TensorId> ins{in[0], g.param("gamma", {cols}, Init{InitKind::ones})};
    if (use_bias_) ins.push_back(g.param("beta", {cols}, Init{}));
    std::vector<TensorId> outs = g.op(OpKind::LayerNormForward, a, ins, {s, {a.rows}, {a.rows}});
    return outs[0];
  }

 private:
  double eps_;
  bool use_bias_;
};

// ONNX: LayerNormalization (opset 17) over the last axis.
void layer_norm_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<LayerNormAttrs>(n.attrs);
  const Shape& xs = g.tensor(n.in[0]).shape;
  if (xs[xs.rank() - 1] != a.cols) e.refuse(n, "a layer norm over other than the last axis");
  OnnxNode x{"LayerNormalization", {e.in(g, n, 0), e.in(g, n, 1)}, {e.out(g, n, 0)}, {}};
  if (a.bias) x.in.push_back(e.in(g, n, 2));
  e.add(std::move(x.i("axis", -1).f("epsilon", a.eps)));
  e.require_opset(17);
}

}  // namespace

KILN_CORE_OPS(layer_norm) {
  for (auto [k, name] : {std::pair{OpKind::LayerNormForward, "layer_norm_forward"},
                         std::pair{OpKind::LayerNormBackward, "layer_norm_backward"}}) {
    OpDesc d = desc<LayerNormAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return layer_norm_arity(k, name, a); },
        ref_of<LayerNormAttrs, layer_norm_ref>(k));
    if (k == OpKind::LayerNormForward) {
      d.grad = layer_norm_grad;
      d.saved_outputs = {1, 2};
    }
    d.cases = cases_of(k, layer_norm_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("layer_norm",
                 [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<LayerNormLayer>(c); });
  register_onnx_mapping(OpKind::LayerNormForward, layer_norm_onnx);
}

}  // namespace kiln::op_impl
