// rms_norm: LLaMA's RMSNorm over the last dimension (PyTorch's torch.nn.RMSNorm, Hugging Face's LlamaRMSNorm):
// per row, rstd = 1 / sqrt(mean_c(x^2) + eps), y = x * rstd * gamma[c]. No mean is subtracted and there is no bias.
// Everything the core knows about it is here: descriptors, reference, gradient rule, conformance cases and the layer.
//
//   rms_norm_forward   in: x(rows, cols), gamma(cols)              out: y(rows, cols), rstd(rows)
//   rms_norm_backward  in: x, gamma, rstd(rows), dy(rows, cols)    out: dx(rows, cols), dgamma(cols)
// With xhat = x * rstd and g = dy * gamma: dx = rstd * (g - xhat * mean_c(g * xhat)), dgamma[c] = sum_r dy * xhat.
// Attributes: LayerNormAttrs (rows, cols, eps; bias must be false).
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/layer.hpp"
#include "kiln/op_table.hpp"
#include "kiln/plugin.hpp"

namespace kiln {
namespace {

OpKind g_forward{}, g_backward{};

const LayerNormAttrs& rms_attrs(const char* op, const OpAttrs& attrs) {
  const auto* a = std::get_if<LayerNormAttrs>(&attrs);
  if (!a) throw Error(std::string("op ") + op + ": expected attributes LayerNormAttrs");
  if (a->rows < 0 || a->cols < 0)
    throw Error(std::string("op ") + op + ": rows and cols must be >= 0, found " + std::to_string(a->rows) + "x" +
                std::to_string(a->cols));
  if (!(a->eps > 0.f) || !std::isfinite(a->eps))
    throw Error(std::string("op ") + op + ": eps must be positive and finite, found " + std::to_string(a->eps));
  if (a->bias) throw Error(std::string("op ") + op + ": RMSNorm has no bias (bias must be false)");
  return *a;
}

int64_t elements(const char* op, const LayerNormAttrs& a) {
  int64_t n = 0;
  if (__builtin_mul_overflow(a.rows, a.cols, &n))
    throw Error(std::string("op ") + op + ": buffer size overflows 64 bits");
  return n;
}

// ---- reference: double accumulation, rows in order ----------------------------------------------------------

void forward_ref(const OpAttrs& attrs, std::span<const float* const> in, std::span<float* const> out) {
  const auto& a = std::get<LayerNormAttrs>(attrs);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = in[0] + r * a.cols;
    double sq = 0;
    for (int64_t c = 0; c < a.cols; ++c) sq += double(x[c]) * x[c];
    const double rstd = 1.0 / std::sqrt((a.cols ? sq / double(a.cols) : 0.0) + double(a.eps));
    for (int64_t c = 0; c < a.cols; ++c) out[0][r * a.cols + c] = static_cast<float>(x[c] * rstd * in[1][c]);
    out[1][r] = static_cast<float>(rstd);
  }
}

void backward_ref(const OpAttrs& attrs, std::span<const float* const> in, std::span<float* const> out) {
  const auto& a = std::get<LayerNormAttrs>(attrs);
  const float *gamma = in[1], *rstd = in[2];
  std::vector<double> dgamma(static_cast<size_t>(a.cols));
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = in[0] + r * a.cols;
    const float* dy = in[3] + r * a.cols;
    const double rs = rstd[r];
    double sgx = 0;
    for (int64_t c = 0; c < a.cols; ++c) {
      const double xhat = x[c] * rs;
      sgx += double(dy[c]) * gamma[c] * xhat;
      dgamma[size_t(c)] += double(dy[c]) * xhat;
    }
    const double mgx = a.cols ? sgx / double(a.cols) : 0.0;
    for (int64_t c = 0; c < a.cols; ++c)
      out[0][r * a.cols + c] = static_cast<float>(rs * (double(dy[c]) * gamma[c] - x[c] * rs * mgx));
  }
  for (int64_t c = 0; c < a.cols; ++c) out[1][c] = static_cast<float>(dgamma[size_t(c)]);
}

// ---- gradient rule: one backward op gives dx and dgamma -------------------------------------------------------

void grad(GradContext& g) {
  const Node& n = g.node();
  const TensorId dx = g.grad_tensor(n.in[0]), dgamma = g.grad_tensor(n.in[1]);
  g.emit(g_backward, n.attrs, {n.in[0], n.in[1], n.out[1], g.dy()}, {dx, dgamma});
  if (g.needs_grad(n.in[0])) g.contribute(n.in[0], dx);
  if (g.needs_grad(n.in[1])) g.contribute(n.in[1], dgamma);
}

// ---- conformance cases: odd sizes, workgroup tails, rows of 70,000 and more elements, many short rows ----------

std::vector<OpCase> cases(bool forward) {
  struct S {
    int64_t rows, cols;
  };
  const S shapes[] = {{1, 1}, {1, 7}, {3, 64}, {5, 65}, {17, 255}, {64, 128}, {2, 70000}, {1, 100003}, {70000, 3}};
  const Gen x = uni(-1.f, 1.f), gamma = uni(0.5f, 1.5f), rstd = uni(0.5f, 2.f);
  std::vector<OpCase> v;
  auto add = [&](std::string id, const LayerNormAttrs& a, bool gradcheck) {
    OpCase c;
    c.id = std::string(forward ? "rms_norm_forward/" : "rms_norm_backward/") + id;
    c.attrs = a;
    c.in = forward ? std::vector<Gen>{x, gamma} : std::vector<Gen>{x, gamma, rstd, x};
    c.out = {kOut, kOut};
    c.check = Check::reduction;
    c.large = a.rows * a.cols >= 65536;
    c.gradcheck = gradcheck;
    v.push_back(std::move(c));
  };
  for (const S& s : shapes)
    add(std::to_string(s.rows) + "x" + std::to_string(s.cols), {s.rows, s.cols, 1e-6f, false}, false);
  if (forward) add("grad.3x5", {3, 5, 1e-6f, false}, true);
  return v;
}

// ---- the layer: [[model.layers]] type = "rms_norm", epsilon (default 1e-6, as LlamaRMSNorm) -----------------

class RmsNormLayer : public Layer {
 public:
  explicit RmsNormLayer(const ConfigNode& c) : eps_(c.get_float("epsilon", 1e-6)) {
    if (!(eps_ > 0) || !std::isfinite(eps_) || eps_ > 1)
      c.fail("epsilon", "expected a small positive number such as 1e-6 (LLaMA's default)");
    c.finish();
  }
  std::string type() const override { return "rms_norm"; }
  // x: (batch, ..., features) -> y: the same shape, normalized over the last axis.
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() < 2)
      throw ConfigError("layer '" + g.layer() + "': rms_norm expects input (batch, ..., features), got " + s.str());
    const int64_t cols = s[s.rank() - 1];
    const LayerNormAttrs a{s.numel() / std::max<int64_t>(cols, 1), cols, static_cast<float>(eps_), false};
    return g.op(g_forward, a, {in[0], g.param("gamma", {cols}, Init{InitKind::ones})}, {s, {a.rows}})[0];
  }

 private:
  double eps_;
};

}  // namespace

KILN_CORE_OPS(rms_norm) {
  OpDesc f;
  f.name = "rms_norm_forward";
  f.attrs_index = OpAttrs(LayerNormAttrs{}).index();
  f.arity = [](const OpAttrs& attrs) -> OpArity {
    const LayerNormAttrs& a = rms_attrs("rms_norm_forward", attrs);
    return {{elements("rms_norm_forward", a), a.cols}, {elements("rms_norm_forward", a), a.rows}};
  };
  f.saved_outputs = {1};
  f.grad = grad;
  f.reference = forward_ref;
  f.cases = [] { return cases(true); };
  g_forward = register_op(std::move(f));

  OpDesc b;
  b.name = "rms_norm_backward";
  b.attrs_index = OpAttrs(LayerNormAttrs{}).index();
  b.arity = [](const OpAttrs& attrs) -> OpArity {
    const LayerNormAttrs& a = rms_attrs("rms_norm_backward", attrs);
    const int64_t n = elements("rms_norm_backward", a);
    return {{n, a.cols, a.rows, n}, {n, a.cols}};
  };
  b.reference = backward_ref;
  b.cases = [] { return cases(false); };
  g_backward = register_op(std::move(b));

  add_core_layer("rms_norm",
                 [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<RmsNormLayer>(c); });
}

}  // namespace kiln
