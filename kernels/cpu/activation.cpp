// Activations (relu, sigmoid, tanh, gelu, gelu_tanh, silu) and row-wise softmax. Outputs may alias inputs
// element for element (ops.hpp), which `omp simd` allows: each lane reads its element before the vector is stored.
#include <algorithm>
#include <cmath>

#include "cpu_kernel.hpp"
#include "kernels.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {

void activation_forward(const ActivationAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const Activation act = a.act;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    switch (act) {
      case Activation::relu:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) y[i] = x[i] < 0.f ? 0.f : x[i];  // NaN passes through
        break;
      case Activation::sigmoid:
        map8(x + b, y + b, e - b, sigmoid8);
        break;
      case Activation::tanh:
        map8(x + b, y + b, e - b, tanh8);
        break;
      case Activation::gelu:
        map8(x + b, y + b, e - b, gelu8);
        break;
      case Activation::gelu_tanh:
        map8(x + b, y + b, e - b, gelu_tanh8);
        break;
      case Activation::silu:
        map8(x + b, y + b, e - b, silu8);
        break;
    }
  });
}

void activation_backward(const ActivationAttrs& a, const float* y, const float* dy, float* dx, ThreadPool& pool) {
  const Activation act = a.act;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    switch (act) {
      case Activation::relu:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];  // loaded unconditionally so the select vectorizes (no branch per element)
          dx[i] = y[i] > 0.f ? g : 0.f;
        }
        break;
      case Activation::sigmoid:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
        break;
      case Activation::tanh:
#pragma omp simd
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
        break;
      case Activation::gelu:  // y holds the forward input x for these three
        map8_times(y + b, dy + b, dx + b, e - b, gelu_grad8);
        break;
      case Activation::gelu_tanh:
        map8_times(y + b, dy + b, dx + b, e - b, gelu_tanh_grad8);
        break;
      case Activation::silu:
        map8_times(y + b, dy + b, dx + b, e - b, silu_grad8);
        break;
    }
  });
}

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

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("activation_forward", {[](CpuDevice& d, const OpCall& c) {
  activation_forward(attrs<ActivationAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("activation_backward", {[](CpuDevice& d, const OpCall& c) {
  activation_backward(attrs<ActivationAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("softmax_forward", {[](CpuDevice& d, const OpCall& c) {
  softmax_forward(attrs<SoftmaxAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("softmax_backward", {[](CpuDevice& d, const OpCall& c) {
  softmax_backward(attrs<SoftmaxAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
}});

}  // namespace kiln::cpu
