// Reference of gradient clipping by global norm (PyTorch's torch.nn.utils.clip_grad_norm_).
#include <cmath>

#include "reference_impl.hpp"

namespace kiln::ref {

// y = alpha * sum x^2 + beta * y, summed in double.
void sum_squares(const ElementwiseAttrs& a, In in, Out out) {
  double s = 0;
  for (int64_t i = 0; i < a.count; ++i) s += double(in[0][i]) * double(in[0][i]);
  const double prev = a.beta != 0.f ? double(a.beta) * double(out[0][0]) : 0.0;
  out[0][0] = static_cast<float>(double(a.alpha) * s + prev);
}

// x *= min(1, max_norm / (sqrt(s) + 1e-6)), the coefficient computed in f32 as PyTorch does (a NaN norm stays NaN,
// as torch.clamp leaves it).
void clip_by_global_norm(const ElementwiseAttrs& a, In in, Out out) {
  const float norm = std::sqrt(in[0][0]);
  float coef = a.alpha / (norm + 1e-6f);
  coef = coef > 1.f ? 1.f : coef;
  for (int64_t i = 0; i < a.count; ++i) out[0][i] *= coef;
}

}  // namespace kiln::ref
