// Row-wise softmax, with attention's causal mask where SoftmaxAttrs::causal asks for it. Outputs may alias inputs
// element for element (ops.hpp), which `omp simd` allows: each lane reads its element before the vector is stored.
#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

// Rows are staged whole (bf16_io.hpp) in a buffer per thread: attention's rows are short (block size), and a
// loss or classifier row of a few thousand floats still fits in L1/L2.
template <class X, class Y>
void softmax_forward(const SoftmaxAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  const int64_t cols = a.cols;
  if (cols == 0) return;
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    thread_local std::vector<float> bx, by;
    if constexpr (!std::is_same_v<X, float>) bx.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<Y, float>) by.resize(static_cast<size_t>(cols));
    for (int64_t r = rb; r < re; ++r) {
      const int64_t valid = a.causal ? r % cols + 1 : cols;  // causal: the columns after r % cols are masked
      const float* xr = f32_in(x + r * cols, valid, bx.data());
      float* yr = f32_out(y + r * cols, by.data());
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, xr[j]);
      const float inv = 1.f / exp_shift_sum(xr, mx, yr, valid);
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j) yr[j] *= inv;
      std::fill(yr + valid, yr + cols, 0.f);
      f32_commit(yr, y + r * cols, cols);
    }
  });
}

template <class Y, class D, class X>
void softmax_backward(const SoftmaxAttrs& a, const Y* y, const D* dy, X* dx, ThreadPool& pool) {
  const int64_t cols = a.cols;
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    thread_local std::vector<float> by, bd, bo;
    if constexpr (!std::is_same_v<Y, float>) by.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<D, float>) bd.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<X, float>) bo.resize(static_cast<size_t>(cols));
    for (int64_t r = rb; r < re; ++r) {
      const float* yr = f32_in(y + r * cols, cols, by.data());
      const float* dyr = f32_in(dy + r * cols, cols, bd.data());
      float* dxr = f32_out(dx + r * cols, bo.data());
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
      f32_commit(dxr, dx + r * cols, cols);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("softmax_forward", {[](CpuDevice& d, const OpCall& c) {
                                      with_type(c.in[0].dtype, [&](auto x) {
                                        with_type(c.out[0].dtype, [&](auto y) {
                                          softmax_forward(attrs<SoftmaxAttrs>(c), buf_as<const decltype(x)>(c.in[0]),
                                                          buf_as<decltype(y)>(c.out[0]), d.pool());
                                        });
                                      });
                                    },
                                    nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("softmax_backward", {[](CpuDevice& d, const OpCall& c) {
                                       with_type(c.in[0].dtype, [&](auto y) {
                                         with_type(c.in[1].dtype, [&](auto dy) {
                                           with_type(c.out[0].dtype, [&](auto dx) {
                                             softmax_backward(attrs<SoftmaxAttrs>(c),
                                                              buf_as<const decltype(y)>(c.in[0]),
                                                              buf_as<const decltype(dy)>(c.in[1]),
                                                              buf_as<decltype(dx)>(c.out[0]), d.pool());
                                           });
                                         });
                                       });
                                     },
                                     nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
