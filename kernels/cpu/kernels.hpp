// The CPU backend's kernels: plain functions over host pointers, multi-threaded with OpenMP.
// Each takes the thread count to use (>= 1) and never allocates; scratch comes from the caller's workspace.
#pragma once
#include <omp.h>

#include <cstddef>
#include <cstdint>

#include "kiln/ops.hpp"

namespace kiln::cpu {

// Below this many elements an elementwise kernel runs on the calling thread: waking the team costs more.
inline constexpr int64_t kParallelMin = 32768;

// The team size for `work` elements: `threads`, or 1 below kParallelMin.
inline int team(int64_t work, int threads) { return threads > 1 && work >= kParallelMin ? threads : 1; }

// Runs body(begin, end) over [0, n) in one contiguous range per thread. With one thread it calls body
// directly: entering an OpenMP region costs about a microsecond even for a team of one.
template <class Body>
inline void parallel_ranges(int64_t n, int threads, Body&& body) {
  if (threads <= 1 || n <= 1) {
    body(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

// gemm.cpp. OpenBLAS runs single-threaded inside our OpenMP threads (see gemm.cpp for why).
void blas_init();
void gemm(const GemmAttrs& a, const float* A, const float* B, float* y, int threads);
// Row-major sgemm on the calling thread only, with leading dimensions (used by the conv kernels).
void sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// conv.cpp. Workspace in floats; the kernels check the size they were given.
size_t conv_workspace_floats(OpKind k, const ConvAttrs& a, int threads);
void conv2d_forward(const ConvAttrs& a, const float* x, const float* w, float* y, float* ws, int threads);
void conv2d_backward_data(const ConvAttrs& a, const float* dy, const float* w, float* dx, float* ws, int threads);
void conv2d_backward_filter(const ConvAttrs& a, const float* x, const float* dy, float* dw, float* ws, int threads);

// pool.cpp
void max_pool_forward(const PoolAttrs& a, const float* x, float* y, int threads);
void max_pool_backward(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx, int threads);
void avg_pool_forward(const PoolAttrs& a, const float* x, float* y, int threads);
void avg_pool_backward(const PoolAttrs& a, const float* dy, float* dx, int threads);

// activation.cpp: activations, softmax.
void activation_forward(const ActivationAttrs& a, const float* x, float* y, int threads);
void activation_backward(const ActivationAttrs& a, const float* y, const float* dy, float* dx, int threads);
void softmax_forward(const SoftmaxAttrs& a, const float* x, float* y, int threads);
void softmax_backward(const SoftmaxAttrs& a, const float* y, const float* dy, float* dx, int threads);

// loss.cpp: fused forward + backward losses. `partials` holds at least loss_partials(threads) doubles.
inline constexpr size_t loss_partials(int threads) { return static_cast<size_t>(threads) * 8; }
void softmax_cross_entropy(const LossAttrs& a, const float* x, const float* labels, float* loss, float* dx,
                           double* partials, int threads);
void mean_squared_error(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                        int threads);
void binary_cross_entropy(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                          int threads);

// elementwise.cpp: bias, elementwise, reductions, concat/split, dropout.
void bias_add(const BiasAttrs& a, const float* x, const float* b, float* y, int threads);
void bias_grad(const BiasAttrs& a, const float* dy, float* db, int threads);
void add(const ElementwiseAttrs& a, const float* x, const float* z, float* y, int threads);
void mul(const ElementwiseAttrs& a, const float* x, const float* z, float* y, int threads);
void axpby(const ElementwiseAttrs& a, const float* x, float* y, int threads);
void scale(const ElementwiseAttrs& a, const float* x, float* y, int threads);
void fill(const ElementwiseAttrs& a, float* y, int threads);
void copy(const ElementwiseAttrs& a, const float* x, float* y, int threads);
void reduce_sum(const ReduceAttrs& a, const float* x, float* y, int threads);
void concat(const ConcatAttrs& a, const float* const* xs, float* y, int threads);
void split(const ConcatAttrs& a, const float* y, float* const* xs, int threads);
void dropout(const DropoutAttrs& a, const float* x, float* y, int threads);

// optimizer.cpp: one fused loop per update.
void sgd_update(const SgdAttrs& a, const float* g, float* w, float* v, int threads);
void adam_update(const AdamAttrs& a, const float* g, float* w, float* m, float* v, int threads);
void rmsprop_update(const RmspropAttrs& a, const float* g, float* w, float* sq, float* buf, int threads);
void ema_update(const EmaAttrs& a, const float* w, float* shadow, int threads);

}  // namespace kiln::cpu
