// Batch normalization per channel of (n, c, inner), training (batch statistics, running statistics updated) or
// evaluation (running statistics); forward saves mean and rstd for the backward op. Semantics: ops.hpp.
// Also the batch_norm layer that emits it (PyTorch's nn.BatchNorm2d on (N, C, H, W) and nn.BatchNorm1d on (N, F)).
#include <cmath>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity batch_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<BatchNormAttrs>(op, attrs);
  check_dims(op, {{"n", a.n}, {"c", a.c}, {"inner", a.inner}});
  if (!(a.eps > 0.f) || !std::isfinite(a.eps))
    throw Error(op_label(op) + ": eps must be positive and finite, found " + std::to_string(a.eps));
  if (!(a.momentum >= 0.f && a.momentum <= 1.f))
    throw Error(op_label(op) + ": momentum must be in [0, 1], found " + std::to_string(a.momentum));
  const int64_t x = product(op, {a.n, a.c, a.inner});
  if (a.training && a.c > 0 && product(op, {a.n, a.inner}) < 2)
    throw Error(op_label(op) + ": training needs more than 1 value per channel (n * inner = " +
                std::to_string(a.n * a.inner) + "), as PyTorch's BatchNorm does");
  if (k == OpKind::BatchNormForward) return {{x, a.c, a.c}, {x, a.c, a.c, a.c, a.c}};
  return {{x, a.c, a.c, a.c, x}, {x, a.c, a.c}};
}

// Batch norm's mean, rstd and running statistics are saved outputs: only y carries a gradient.
void batch_norm_grad(GradContext& g) {
  const Node& n = g.node();
  std::vector<TensorId> parts;
  for (size_t i = 0; i < 3; ++i) parts.push_back(g.grad_tensor(n.in[i]));
  g.emit(OpKind::BatchNormBackward, n.attrs, {n.in[0], n.in[1], n.out[1], n.out[2], g.dy()}, parts);
  for (size_t i = 0; i < 3; ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

// Per channel over (n, inner), double accumulation. x: (n, c, inner); gamma, beta, mean, rstd, running
// statistics: (c).
void batch_norm_ref(OpKind kind, const BatchNormAttrs& a, In in, Out out) {
  const int64_t N = a.n, C = a.c, I = a.inner;
  const double m = double(N) * double(I);
  const float* x = in[0];
  const float* gamma = in[1];
  if (kind == OpKind::BatchNormForward) {
    const float* beta = in[2];
    float *y = out[0], *mean_out = out[1], *rstd_out = out[2], *run_mean = out[3], *run_var = out[4];
    for (int64_t c = 0; c < C; ++c) {
      double mean, rstd;
      if (a.training) {
        double sum = 0;
        for (int64_t o = 0; o < N; ++o)
          for (int64_t i = 0; i < I; ++i) sum += x[(o * C + c) * I + i];
        mean = m > 0 ? sum / m : 0.0;
        double sq = 0;
        for (int64_t o = 0; o < N; ++o)
          for (int64_t i = 0; i < I; ++i) {
            const double d = x[(o * C + c) * I + i] - mean;
            sq += d * d;
          }
        const double var = m > 0 ? sq / m : 0.0;
        rstd = 1.0 / std::sqrt(var + double(a.eps));
        const double mom = a.momentum;
        const double unbiased = m > 1 ? var * m / (m - 1) : var;
        run_mean[c] = static_cast<float>((1.0 - mom) * run_mean[c] + mom * mean);
        run_var[c] = static_cast<float>((1.0 - mom) * run_var[c] + mom * unbiased);
      } else {
        mean = run_mean[c];
        rstd = 1.0 / std::sqrt(double(run_var[c]) + double(a.eps));
      }
      for (int64_t o = 0; o < N; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const int64_t j = (o * C + c) * I + i;
          y[j] = static_cast<float>((x[j] - mean) * rstd * gamma[c] + beta[c]);
        }
      mean_out[c] = static_cast<float>(mean);
      rstd_out[c] = static_cast<float>(rstd);
    }
    return;
  }
  const float *mean = in[2], *rstd = in[3], *dy = in[4];
  float *dx = out[0], *dgamma = out[1], *dbeta = out[2];
  for (int64_t c = 0; c < C; ++c) {
    const double mu = mean[c], rs = rstd[c], ga = gamma[c];
    double sdy = 0, sdyx = 0;
    for (int64_t o = 0; o < N; ++o)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t j = (o * C + c) * I + i;
        sdy += dy[j];
        sdyx += double(dy[j]) * (x[j] - mu) * rs;
      }
    // mean(g) = gamma * mean(dy), mean(g * xhat) = gamma * mean(dy * xhat).
    const double mg = a.training && m > 0 ? ga * sdy / m : 0.0, mgx = a.training && m > 0 ? ga * sdyx / m : 0.0;
    for (int64_t o = 0; o < N; ++o)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t j = (o * C + c) * I + i;
        const double xhat = (x[j] - mu) * rs;
        dx[j] = static_cast<float>(rs * (double(dy[j]) * ga - mg - xhat * mgx));
      }
    dgamma[c] = static_cast<float>(sdyx);
    dbeta[c] = static_cast<float>(sdy);
  }
}

// Training and evaluation: rank-2 (inner 1) and image shapes, tails around 64/256, and channels of 70,000+ values
// three ways (one long image row, many samples of inner 1, several samples of long images) so the per-channel
// reductions are long. Running statistics are read-write outputs with data.
void batch_norm_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("3x4x5", OpKind::BatchNormForward, BatchNormAttrs{3, 4, 5, 1e-5f, 0.1f, true}, {f, uni(0.5f, 1.5f), f},
         {kOut, kOut, kOut, uni(-0.5f, 0.5f), uni(0.5f, 2.f)}, Check::reduction);
  t.grad("6x3", OpKind::BatchNormForward, BatchNormAttrs{6, 3, 1, 1e-5f, 0.1f, true}, {f, uni(0.5f, 1.5f), f},
         {kOut, kOut, kOut, uni(-0.5f, 0.5f), uni(0.5f, 2.f)}, Check::reduction);

  struct S {
    int64_t n, c, inner;
  };
  const S shapes[] = {{2, 1, 1},   {4, 3, 1},   {2, 3, 5},     {3, 7, 64},    {5, 16, 65},
                      {2, 4, 255}, {32, 64, 1}, {1, 2, 70001}, {70000, 3, 1}, {8, 2, 9000}};
  const Gen mean = uni(-0.5f, 0.5f), rstd = uni(0.5f, 2.f), gamma = uni(0.5f, 1.5f);
  const Gen run_mean = uni(-0.5f, 0.5f), run_var = uni(0.5f, 2.f);
  for (const S& sh : shapes)
    for (bool training : {true, false}) {
      const BatchNormAttrs a{sh.n, sh.c, sh.inner, 1e-5f, 0.1f, training};
      const std::string v = str(sh.n) + "x" + str(sh.c) + "x" + str(sh.inner) + (training ? "" : ".eval");
      t.add(v, OpKind::BatchNormForward, a, {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction,
            false);
      t.add(v, OpKind::BatchNormBackward, a, {kF, gamma, mean, rstd, kF}, {kOut, kOut, kOut}, Check::reduction, false);
    }
  // A channel of 4,200,002 values: more than one Vulkan dispatch's share (256 x 16,384), so partial sums accumulate.
  for (bool training : {true, false}) {
    const BatchNormAttrs a{2, 1, 2100001, 1e-5f, 0.1f, training};
    const std::string v = std::string("2x1x2100001") + (training ? "" : ".eval");
    t.add(v, OpKind::BatchNormForward, a, {kF, gamma, kF}, {kOut, kOut, kOut, run_mean, run_var}, Check::reduction,
          false)
        .large = true;
    t.add(v, OpKind::BatchNormBackward, a, {kF, gamma, mean, rstd, kF}, {kOut, kOut, kOut}, Check::reduction, false)
        .large = true;
  }
  // Momentum 1 (the running statistics become the batch's) and 0 (they stay), a larger epsilon.
  t.add("4x3x5.momentum1", OpKind::BatchNormForward, BatchNormAttrs{4, 3, 5, 1e-3f, 1.f, true}, {kF, gamma, kF},
        {kOut, kOut, kOut, run_mean, run_var}, Check::reduction, false);
  t.add("4x3x5.momentum0", OpKind::BatchNormForward, BatchNormAttrs{4, 3, 5, 1e-5f, 0.f, true}, {kF, gamma, kF},
        {kOut, kOut, kOut, run_mean, run_var}, Check::reduction, false);
}

// ---- the layer ---------------------------------------------------------------------------------------------

// Training normalizes with the batch's per-channel statistics and updates the running statistics (buffers
// "<layer>.running_mean" = 0 and "<layer>.running_var" = 1 at start, checkpointed, never trained); evaluation
// graphs normalize with the running statistics. sync = true (PyTorch's SyncBatchNorm) makes data_parallel compute
// the statistics over the global batch, every replica's and process's rows; elsewhere one device holds the whole
// batch and it changes nothing. gamma (ones) and beta (zeros) are parameters, or with
// affine = false constant buffers (PyTorch's affine=False).
class BatchNormLayer : public Layer {
 public:
  explicit BatchNormLayer(const ConfigNode& c)
      : momentum_(c.get_float("momentum", 0.1)),
        eps_(c.get_float("epsilon", 1e-5)),
        affine_(c.get_bool("affine", true)) {
    if (!(momentum_ >= 0 && momentum_ <= 1))
      c.fail("momentum",
             "expected a number in [0, 1] such as 0.1 (PyTorch's default; the running statistics move "
             "by this fraction of the batch's each step), found " +
                 std::to_string(momentum_));
    if (!(eps_ > 0) || !std::isfinite(eps_) || eps_ > 1)
      c.fail("epsilon",
             "expected a small positive number such as 1e-5 (PyTorch's default), found " + std::to_string(eps_));
    sync_ = c.get_bool("sync", false);
    c.finish();
  }
  std::string type() const override { return "batch_norm"; }
  // x: (N, C, H, W) -> y: (N, C, H, W), statistics per channel over (N, H, W); x: (N, F) -> (N, F), per feature.
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    if (s.rank() != 2 && s.rank() != 4)
      throw ConfigError("layer '" + g.layer() +
                        "': batch_norm expects input (batch, channels, height, width) or "
                        "(batch, features), got " +
                        s.str());
    const int64_t c = s[1], inner = s.rank() == 4 ? s[2] * s[3] : 1;
    BatchNormAttrs a{s[0], c, inner, static_cast<float>(eps_), static_cast<float>(momentum_), g.training(), sync_};
    if (a.training && a.n * a.inner < 2)
      throw ConfigError("layer '" + g.layer() +
                        "': batch_norm in training needs more than one value per channel, "
                        "input " +
                        s.str() + " has " + std::to_string(a.n * a.inner) + " (raise [train] batch_size)");
    TensorId gamma, beta;
    if (affine_) {
      gamma = g.param("gamma", {c}, Init{InitKind::ones});
      beta = g.param("beta", {c}, Init{});
    } else {
      gamma = g.buffer("gamma", {c}, Init{InitKind::ones});
      beta = g.buffer("beta", {c}, Init{});
    }
    const TensorId running_mean = g.buffer("running_mean", {c}, Init{});
    const TensorId running_var = g.buffer("running_var", {c}, Init{InitKind::ones});
    std::vector<TensorId> outs = g.op(OpKind::BatchNormForward, a, {in[0], gamma, beta}, {s, {c}, {c}});
    // The running statistics are read-write outputs of the same node (no new storage).
    Node& n = g.graph().nodes().back();
    n.out.push_back(running_mean);
    n.out.push_back(running_var);
    return outs[0];
  }

 private:
  double momentum_, eps_;
  bool affine_;
  bool sync_ = false;  // statistics over every data_parallel replica's rows (the strategy does it; see ops.hpp)
};

// ONNX: BatchNormalization in evaluation, with the running statistics.
void batch_norm_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<BatchNormAttrs>(n.attrs);
  if (a.training) e.refuse(n, "a batch norm in training mode");
  const Shape& xs = g.tensor(n.in[0]).shape;
  if (xs.rank() < 2 || xs[1] != a.c) e.refuse(n, "a batch norm whose channels are not axis 1");
  e.add(OnnxNode{
      "BatchNormalization",
      {e.in(g, n, 0), e.in(g, n, 1), e.in(g, n, 2), e.out(g, n, 3), e.out(g, n, 4)},
      {e.out(g, n, 0)},
      {}}.f("epsilon", a.eps));
}

}  // namespace

KILN_CORE_OPS(batch_norm) {
  for (auto [k, name] : {std::pair{OpKind::BatchNormForward, "batch_norm_forward"},
                         std::pair{OpKind::BatchNormBackward, "batch_norm_backward"}}) {
    OpDesc d = desc<BatchNormAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return batch_norm_arity(k, name, a); },
        ref_of<BatchNormAttrs, batch_norm_ref>(k));
    if (k == OpKind::BatchNormForward) {
      d.grad = batch_norm_grad;
      d.saved_outputs = {1, 2, 3, 4};
    }
    d.cases = cases_of(k, batch_norm_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("batch_norm", factory<BatchNormLayer>());
  register_onnx_mapping(OpKind::BatchNormForward, batch_norm_onnx);
}

}  // namespace kiln::op_impl
