// Row-wise softmax, with attention's causal mask where SoftmaxAttrs::causal asks for it. Outputs may alias inputs
// element for element (ops.hpp), which `omp simd` allows: each lane reads its element before the vector is stored.
#include <algorithm>
#include <cmath>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

void softmax_forward(const SoftmaxAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const int64_t cols = a.cols;
  if (cols == 0) return;
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const int64_t valid = a.causal ? r % cols + 1 : cols;  // causal: the columns after r % cols are masked
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, xr[j]);
      const float inv = 1.f / exp_shift_sum(xr, mx, yr, valid);
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j) yr[j] *= inv;
      std::fill(yr + valid, yr + cols, 0.f);
    }
  });
}

void softmax_backward(const SoftmaxAttrs& a, const float* y, const float* dy, float* dx, ThreadPool& pool) {
  const int64_t cols = a.cols;
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float* yr = y + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("softmax_forward", {[](CpuDevice& d, const OpCall& c) {
                  softmax_forward(attrs<SoftmaxAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("softmax_backward", {[](CpuDevice& d, const OpCall& c) {
                  softmax_backward(attrs<SoftmaxAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
