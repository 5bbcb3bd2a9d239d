// The fused losses: softmax cross-entropy (class labels or probabilities), mean squared error and binary
// cross-entropy (from logits or probabilities). Each writes the scalar loss and its gradient w.r.t. the
// prediction. Semantics: ops.hpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/onnx_export.hpp"
#include "kiln/step.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity loss_arity(OpKind k, std::string_view name, const OpAttrs& attrs) {
  const auto& a = attrs_as<LossAttrs>(name, attrs);
  check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
  const int64_t n = product(name, {a.rows, a.cols});
  if (k == OpKind::SoftmaxCrossEntropy) return {{n, a.soft_labels ? n : a.rows}, {1, n}};
  return {{n, n}, {1, n}};
}

// A fused loss already computed its gradient w.r.t. the prediction (out[1]).
void loss_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.contribute(n.in[0], n.out[1]);
}

void loss_ref(OpKind kind, const LossAttrs& a, In in, Out out) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double total = 0;
  if (kind == OpKind::SoftmaxCrossEntropy) {
    for (int64_t r = 0; r < a.rows; ++r) {
      const float* x = in[0] + r * a.cols;
      float* dx = out[1] + r * a.cols;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < a.cols; ++j) mx = std::max<double>(mx, x[j]);
      double sum = 0;
      for (int64_t j = 0; j < a.cols; ++j) sum += std::exp(double(x[j]) - mx);
      const double lse = mx + std::log(sum);
      if (a.soft_labels) {
        const float* t = in[1] + r * a.cols;
        double tsum = 0;
        for (int64_t j = 0; j < a.cols; ++j) tsum += t[j], total += double(t[j]) * (lse - x[j]);
        for (int64_t j = 0; j < a.cols; ++j)
          dx[j] = static_cast<float>(a.scale * (std::exp(double(x[j]) - lse) * tsum - double(t[j])));
        continue;
      }
      const float lf = in[1][r];
      const bool ok = lf >= 0.0f && lf < static_cast<float>(a.cols);
      const int64_t label = ok ? static_cast<int64_t>(lf) : -1;
      total += ok ? lse - x[label] : nan;
      for (int64_t j = 0; j < a.cols; ++j)
        dx[j] = static_cast<float>(a.scale * (std::exp(double(x[j]) - lse) - (j == label ? 1.0 : 0.0)));
    }
    out[0][0] = static_cast<float>(a.scale * total);
    return;
  }
  const double per = a.cols > 0 ? double(a.scale) / double(a.cols) : 0.0;
  const int64_t n = a.rows * a.cols;
  for (int64_t i = 0; i < n; ++i) {
    const double p = in[0][i], t = in[1][i];
    double g = 0;
    if (kind == OpKind::MeanSquaredError) {
      total += (p - t) * (p - t);
      g = 2.0 * (p - t);
    } else if (a.from_logits) {
      total += std::max(p, 0.0) - p * t + std::log1p(std::exp(-std::abs(p)));
      g = 1.0 / (1.0 + std::exp(-p)) - t;
    } else {
      const double pc = std::clamp(p, 1e-7, 1.0 - 1e-7);
      total += -(t * std::log(pc) + (1.0 - t) * std::log(1.0 - pc));
      g = (pc - t) / (pc * (1.0 - pc));
    }
    out[1][i] = static_cast<float>(per * g);
  }
  out[0][0] = static_cast<float>(per * total);
}

void loss_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("4x7", OpKind::SoftmaxCrossEntropy, LossAttrs{4, 7, 0.25f, true}, {uni(-2.f, 2.f), {Gen::labels, 0, 7.f}},
         {kOut, kOut}, Check::reduction);
  t.grad("4x7", OpKind::MeanSquaredError, LossAttrs{4, 7, 0.25f, true}, {f, f}, {kOut, kOut}, Check::reduction);
  t.grad("4x7.logits", OpKind::BinaryCrossEntropy, LossAttrs{4, 7, 0.25f, true}, {uni(-3.f, 3.f), uni(0.f, 1.f)},
         {kOut, kOut}, Check::reduction);
  t.grad("4x7.probabilities", OpKind::BinaryCrossEntropy, LossAttrs{4, 7, 0.25f, false},
         {uni(0.1f, 0.9f), uni(0.f, 1.f)}, {kOut, kOut}, Check::reduction);

  struct S {
    int64_t rows, cols;
  };
  const S shapes[] = {{1, 1}, {4, 10}, {64, 10}, {130, 7}, {33, 1000}};
  for (const S& s : shapes) {
    const std::string v = str(s.rows) + "x" + str(s.cols);
    LossAttrs a{s.rows, s.cols, 1.f / float(s.rows), true};
    t.add(v, OpKind::SoftmaxCrossEntropy, a, {uni(-6.f, 6.f), {Gen::labels, 0, float(s.cols)}}, {kOut, kOut},
          Check::reduction, false);
    LossAttrs soft = a;  // labels as class probabilities (and below, one-hot-like 0/1 rows)
    soft.soft_labels = true;
    t.add(v + ".probabilities", OpKind::SoftmaxCrossEntropy, soft, {uni(-6.f, 6.f), uni(0.f, 1.f)}, {kOut, kOut},
          Check::reduction, false);
    t.add(v + ".binary_labels", OpKind::SoftmaxCrossEntropy, soft, {uni(-6.f, 6.f), ints(0, 1)}, {kOut, kOut},
          Check::reduction, false);
    t.add(v, OpKind::MeanSquaredError, a, {kF, kF}, {kOut, kOut}, Check::reduction, false);
    t.add(v + ".logits", OpKind::BinaryCrossEntropy, a, {uni(-8.f, 8.f), ints(0, 1)}, {kOut, kOut}, Check::reduction,
          false);
    LossAttrs p = a;
    p.from_logits = false;
    t.add(v + ".probabilities", OpKind::BinaryCrossEntropy, p, {uni(0.001f, 0.999f), uni(0.f, 1.f)}, {kOut, kOut},
          Check::reduction, false);
  }
  LossAttrs a{4, 10, 0.25f, true};
  t.add("4x10.bad_label_gives_nan", OpKind::SoftmaxCrossEntropy, a, {uni(-6.f, 6.f), {Gen::labels_bad, 0, 10.f}},
        {kOut, kOut}, Check::reduction, false);
  t.add("2x4200000.int", OpKind::MeanSquaredError, LossAttrs{2, 4200000, 0.5f, true}, {kI, kI}, {kOut, kOut},
        Check::reduction, false)
      .large = true;
  t.add("8x10.int", OpKind::MeanSquaredError, LossAttrs{8, 10, 1.f, true}, {kI, kI}, {kOut, kOut}, Check::reduction,
        false);

  // Long loops (op_support.hpp): the cross-entropy's scalar loss walked 64 rows at a time, every column of each row
  // in one invocation; the elementwise losses sum in one workgroup.
  struct L {
    int64_t rows, cols;
    bool large;
  };
  const L ce[] = {{2, 40000, false}, {130, 20000, true}, {640, 10000, true}};
  for (const L& l : ce)
    t.add(str(l.rows) + "x" + str(l.cols), OpKind::SoftmaxCrossEntropy,
          LossAttrs{l.rows, l.cols, 1.f / float(l.rows), true}, {uni(-6.f, 6.f), {Gen::labels, 0, float(l.cols)}},
          {kOut, kOut}, Check::reduction, false)
        .large = l.large;
  t.add("3x3000000.int", OpKind::MeanSquaredError, LossAttrs{3, 3000000, 1.f / 3.f, true}, {kI, kI}, {kOut, kOut},
        Check::reduction, false)
      .large = true;
  t.add("3x3000000.logits", OpKind::BinaryCrossEntropy, LossAttrs{3, 3000000, 1.f / 3.f, true},
        {uni(-8.f, 8.f), ints(0, 1)}, {kOut, kOut}, Check::reduction, false)
      .large = true;
}

}  // namespace

KILN_CORE_OPS(loss) {
  for (auto [k, name] : {std::pair{OpKind::SoftmaxCrossEntropy, "softmax_cross_entropy"},
                         std::pair{OpKind::MeanSquaredError, "mean_squared_error"},
                         std::pair{OpKind::BinaryCrossEntropy, "binary_cross_entropy"}}) {
    OpDesc d = desc<LossAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return loss_arity(k, name, a); },
        ref_of<LossAttrs, loss_ref>(k));
    d.is_loss = true;
    d.data_inputs = {1};
    // float16's loss scaling multiplies the loss and its gradient (a scale of 1 otherwise).
    d.step_scalars = kStepLossScale;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<LossAttrs>(a).scale *= s.loss_scale; };
    d.grad = loss_grad;
    d.cases = cases_of(k, loss_cases);
    register_op(k, std::move(d));
  }
  // Not part of inference: the exported model ends at the heads' predictions.
  for (OpKind k : {OpKind::SoftmaxCrossEntropy, OpKind::MeanSquaredError, OpKind::BinaryCrossEntropy})
    register_onnx_mapping(k, [](OnnxEmitter&, const Graph&, const Node&) {});
}

}  // namespace kiln::op_impl
