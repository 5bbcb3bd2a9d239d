// RMSNorm over the last dimension, forward and backward (semantics: core/ops/rms_norm.cpp). Rows are independent
// (split over threads); dgamma is split over columns, each thread summing its columns over every row in order:
// deterministic for any thread count, no atomics.
#include <cmath>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

// x: (rows, cols), gamma: (cols) -> y: (rows, cols), rstd: (rows)
void rms_norm_forward(const LayerNormAttrs& a, const float* x, const float* gamma, float* y, float* rstd,
                      ThreadPool& pool) {
  const int64_t C = a.cols;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, a.rows, parts_for(a.rows * C, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += xr[c] * xr[c];
      const float rs = 1.f / std::sqrt(sq * inv_c + a.eps);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * gamma[c];
      rstd[r] = rs;
    }
  });
}

// x, dy: (rows, cols), gamma: (cols), rstd: (rows) -> dx: (rows, cols), dgamma: (cols)
void rms_norm_backward(const LayerNormAttrs& a, const float* x, const float* gamma, const float* rstd, const float* dy,
                       float* dx, float* dgamma, ThreadPool& pool) {
  const int64_t C = a.cols, R = a.rows;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, R, parts_for(R * C, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      float* dxr = dx + r * C;
      const float rs = rstd[r];
      float sgx = 0.f;
#pragma omp simd reduction(+ : sgx)
      for (int64_t c = 0; c < C; ++c) sgx += dyr[c] * gamma[c] * xr[c] * rs;
      const float mgx = sgx * inv_c;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - xr[c] * rs * mgx);
    }
  });
  parallel_ranges(pool, C, parts_for(R * C, pool), [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) dgamma[c] = 0.f;
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * C;
      const float* dyr = dy + r * C;
      const float rs = rstd[r];
#pragma omp simd
      for (int64_t c = cb; c < ce; ++c) dgamma[c] += dyr[c] * xr[c] * rs;
    }
  });
}

}  // namespace

KILN_CPU_KERNEL("rms_norm_forward", {[](CpuDevice& d, const OpCall& c) {
                  rms_norm_forward(attrs<LayerNormAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.pool());
                }});
KILN_CPU_KERNEL("rms_norm_backward", {[](CpuDevice& d, const OpCall& c) {
                  rms_norm_backward(attrs<LayerNormAttrs>(c), in(c, 0), in(c, 1), in(c, 2), in(c, 3), out(c, 0),
                                    out(c, 1), d.pool());
                }});

}  // namespace kiln::cpu
