// Gradient clipping by global norm: the sum of squares of a gradient (float lanes over short runs, double across
// runs and threads, summed in range order so the result does not depend on scheduling) and the clip scale.
#include <algorithm>
#include <cmath>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void sum_squares(const ElementwiseAttrs& a, const float* x, float* y, double* partials, ThreadPool& pool) {
  const int64_t n = a.count;
  auto body = [&](int64_t b, int64_t e) {
    double out = 0;
    for (int64_t c = b; c < e; c += 4096) {
      const int64_t ce = std::min(e, c + 4096);
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = c; i < ce; ++i) acc += x[i] * x[i];
      out += acc;
    }
    return out;
  };
  const int64_t parts = std::min<int64_t>(parts_for(n, pool), std::max<int64_t>(n, 1));
  double total = 0;
  if (parts <= 1) {
    total = body(0, n);
  } else {
    pool.run(parts, [&](int64_t c, int) { partials[c * 8] = body(n * c / parts, n * (c + 1) / parts); });
    for (int64_t c = 0; c < parts; ++c) total += partials[c * 8];
  }
  const double prev = a.beta != 0.f ? double(a.beta) * double(y[0]) : 0.0;
  y[0] = static_cast<float>(double(a.alpha) * total + prev);
}

void clip_by_global_norm(const ElementwiseAttrs& a, const float* s, float* x, ThreadPool& pool) {
  float coef = a.alpha / (std::sqrt(s[0]) + 1e-6f);
  coef = coef > 1.f ? 1.f : coef;  // NaN stays NaN, as torch.clamp leaves it
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) x[i] *= coef;
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("sum_squares", {[](CpuDevice& d, const OpCall& c) {
                  sum_squares(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.partials(), d.pool());
                }});
KILN_CPU_KERNEL("clip_by_global_norm", {[](CpuDevice& d, const OpCall& c) {
                  clip_by_global_norm(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
