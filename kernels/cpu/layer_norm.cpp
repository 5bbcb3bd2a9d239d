// Layer normalization over the last dimension, forward and backward. Rows are independent (split over threads);
// the parameter gradients are split over columns, so each thread sums its columns over every row in order:
// deterministic for any thread count, no atomics. beta and dbeta are null without a bias.
#include <cmath>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void layer_norm_forward(const LayerNormAttrs& a, const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, ThreadPool& pool) {
  const int64_t C = a.cols;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, a.rows, parts_for(a.rows * C, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const float m = sum * inv_c;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (xr[c] - m) * (xr[c] - m);
      const float rs = 1.f / std::sqrt(sq * inv_c + a.eps);
      if (beta) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * gamma[c];
      }
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

void layer_norm_backward(const LayerNormAttrs& a, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, ThreadPool& pool) {
  const int64_t C = a.cols, R = a.rows;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, R, parts_for(R * C, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      const float m = mean[r], rs = rstd[r];
      float sg = 0.f, sgx = 0.f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyr[c] * gamma[c];
        sg += g;
        sgx += g * (xr[c] - m) * rs;
      }
      const float mg = sg * inv_c, mgx = sgx * inv_c;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - mg - (xr[c] - m) * rs * mgx);
    }
  });
  parallel_ranges(pool, C, parts_for(R * C, pool), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      dgamma[c] = 0.f;
      if (dbeta) dbeta[c] = 0.f;
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      const float m = mean[r], rs = rstd[r];
#pragma omp simd
      for (int64_t c = cb; c < ce; ++c) dgamma[c] += dyr[c] * (xr[c] - m) * rs;
      if (dbeta) {
#pragma omp simd
        for (int64_t c = cb; c < ce; ++c) dbeta[c] += dyr[c];
      }
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("layer_norm_forward", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<LayerNormAttrs>(c);
                  layer_norm_forward(a, in(c, 0), in(c, 1), a.bias ? in(c, 2) : nullptr, out(c, 0), out(c, 1),
                                     out(c, 2), d.pool());
                }});
KILN_CPU_KERNEL("layer_norm_backward", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<LayerNormAttrs>(c);
                  layer_norm_backward(a, in(c, 0), in(c, 1), in(c, 2), in(c, 3), in(c, 4), out(c, 0), out(c, 1),
                                      a.bias ? out(c, 2) : nullptr, d.pool());
                }});

}  // namespace kiln::cpu
