// Activations and row-wise softmax. Outputs may alias inputs element for element (ops.hpp), which
// `omp simd` allows: each lane reads its element before the vector is stored.
#include <algorithm>

#include "kernels.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {

void activation_forward(const ActivationAttrs& a, const float* x, float* y, int threads) {
  const int64_t n = a.count;
  const bool par = threads > 1 && n >= kParallelMin;
  switch (a.act) {
    case Activation::relu:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.f ? 0.f : x[i];  // NaN passes through
      break;
    case Activation::sigmoid:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_approx(x[i]);
      break;
    case Activation::tanh:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = tanh_approx(x[i]);
      break;
  }
}

void activation_backward(const ActivationAttrs& a, const float* y, const float* dy, float* dx, int threads) {
  const int64_t n = a.count;
  const bool par = threads > 1 && n >= kParallelMin;
  switch (a.act) {
    case Activation::relu:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i];  // loaded unconditionally so the select vectorizes (no branch per element)
        dx[i] = y[i] > 0.f ? g : 0.f;
      }
      break;
    case Activation::sigmoid:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
      break;
    case Activation::tanh:
#pragma omp parallel for simd num_threads(threads) if (par) schedule(static)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
      break;
  }
}

void softmax_forward(const SoftmaxAttrs& a, const float* x, float* y, int threads) {
  const int64_t cols = a.cols;
  const bool par = threads > 1 && a.rows * cols >= kParallelMin && a.rows > 1;
#pragma omp parallel for num_threads(threads) if (par) schedule(static)
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, xr[j]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < cols; ++j) {
      const float e = exp_approx(xr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void softmax_backward(const SoftmaxAttrs& a, const float* y, const float* dy, float* dx, int threads) {
  const int64_t cols = a.cols;
  const bool par = threads > 1 && a.rows * cols >= kParallelMin && a.rows > 1;
#pragma omp parallel for num_threads(threads) if (par) schedule(static)
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

}  // namespace kiln::cpu
