// Gradient clipping by global norm (PyTorch's torch.nn.utils.clip_grad_norm_): a sum of squares accumulated over
// every gradient, then one scale each. Semantics: ops.hpp.
#include <cmath>

#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

// y = alpha * sum x^2 + beta * y, summed in double.
void sum_squares_ref(const ElementwiseAttrs& a, In in, Out out) {
  double s = 0;
  for (int64_t i = 0; i < a.count; ++i) s += double(in[0][i]) * double(in[0][i]);
  const double prev = a.beta != 0.f ? double(a.beta) * double(out[0][0]) : 0.0;
  out[0][0] = static_cast<float>(double(a.alpha) * s + prev);
}

// x *= min(1, max_norm / (sqrt(s) + 1e-6)), the coefficient computed in f32 as PyTorch does (a NaN norm stays NaN,
// as torch.clamp leaves it).
void clip_by_global_norm_ref(const ElementwiseAttrs& a, In in, Out out) {
  const float norm = std::sqrt(in[0][0]);
  float coef = a.alpha / (norm + 1e-6f);
  coef = coef > 1.f ? 1.f : coef;
  for (int64_t i = 0; i < a.count; ++i) out[0][i] *= coef;
}

// The sum of squares accumulates over many tensors (beta = 1) and must stay right at lengths past what one shader
// invocation may loop over; the scale clips (max_norm below the norm) or not.
void clip_cases(Table& t) {
  for (int64_t s : {1, 63, 64, 65, 257, 10007}) {
    const std::string v = str(s);
    t.add(v + ".int", OpKind::SumSquares, ElementwiseAttrs{s, 1.f, 0.f}, {kI}, {kOut}, Check::reduction, true);
    t.add(v + ".accumulate.int", OpKind::SumSquares, ElementwiseAttrs{s, 1.f, 1.f}, {kI}, {kI}, Check::reduction, true);
    t.add(v + ".alpha0.5.beta2", OpKind::SumSquares, ElementwiseAttrs{s, 0.5f, 2.f}, {kF}, {kF}, Check::reduction,
          false);
    for (float mx : {0.5f, 1.f, 10.f})
      t.add(v + ".max" + (mx == 0.5f ? std::string("0.5") : str(int64_t(mx))), OpKind::ClipByGlobalNorm,
            ElementwiseAttrs{s, mx, 0.f}, {uni(0.25f, 4.f)}, {kF}, Check::elementwise, false);
  }
  // 64 * 32768 elements and more: several dispatches on Vulkan; 0/1 squares keep the f32 sums exact.
  t.add("2100000.int", OpKind::SumSquares, ElementwiseAttrs{2100000, 1.f, 0.f}, {ints(-1, 1)}, {kOut}, Check::reduction,
        true);
  t.add("4200001.accumulate.int", OpKind::SumSquares, ElementwiseAttrs{4200001, 1.f, 1.f}, {ints(-1, 1)}, {ints(0, 3)},
        Check::reduction, true)
      .large = true;
  t.add("3000001.max1", OpKind::ClipByGlobalNorm, ElementwiseAttrs{3000001, 1.f, 0.f}, {uni(0.25f, 4.f)}, {kF},
        Check::elementwise, false)
      .large = true;
}

}  // namespace

KILN_CORE_OPS(clip) {
  {
    OpDesc d = desc<ElementwiseAttrs>(
        "sum_squares",
        [](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<ElementwiseAttrs>("sum_squares", a);
          return {{n}, {1}};
        },
        ref_of<ElementwiseAttrs, sum_squares_ref>());
    d.cases = cases_of(OpKind::SumSquares, clip_cases);
    register_op(OpKind::SumSquares, std::move(d));
  }
  OpDesc d = desc<ElementwiseAttrs>(
      "clip_by_global_norm",
      [](const OpAttrs& a) -> OpArity {
        const int64_t n = counted<ElementwiseAttrs>("clip_by_global_norm", a);
        return {{1}, {n}};
      },
      ref_of<ElementwiseAttrs, clip_by_global_norm_ref>());
  d.cases = cases_of(OpKind::ClipByGlobalNorm, clip_cases);
  register_op(OpKind::ClipByGlobalNorm, std::move(d));
}

}  // namespace kiln::op_impl
