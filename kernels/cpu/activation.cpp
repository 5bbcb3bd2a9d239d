// Activations (relu, sigmoid, tanh, gelu, gelu_tanh, silu). Outputs may alias inputs element for element (ops.hpp),
// which `omp simd` allows: each lane reads its element before the vector is stored.
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

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

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("activation_forward", {[](CpuDevice& d, const OpCall& c) {
                  activation_forward(attrs<ActivationAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("activation_backward", {[](CpuDevice& d, const OpCall& c) {
                  activation_backward(attrs<ActivationAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
