// Activations (relu, sigmoid, tanh, gelu, gelu_tanh, silu), forward and backward, and the registration of their ops.
// Built with --fmad=false: no contraction, so the results round like the CPU reference does.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// ActivationAttrs::act's values, as the kernels switch over them.
enum class Act : int { relu = 0, sigmoid = 1, tanh = 2, gelu = 3, gelu_tanh = 4, silu = 5 };

__global__ void activation_forward_kernel(Act act, const float* x, float* y, int64_t n) {
  KILN_GRID_STRIDE(i, n) {
    const float v = x[i];
    switch (act) {
      case Act::relu:
        y[i] = v < 0.f ? 0.f : v;
        break;  // NaN passes through, like the reference
      case Act::sigmoid:
        y[i] = 1.f / (1.f + expf(-v));
        break;
      case Act::tanh:
        y[i] = tanhf(v);
        break;
      case Act::gelu:
        y[i] = 0.5f * v * erfcf(-v * 0.70710678118654752f);
        break;
      case Act::gelu_tanh:
        y[i] = v / (1.f + expf(-2.f * 0.79788456080286536f * (v + 0.044715f * v * v * v)));
        break;
      case Act::silu:
        y[i] = v / (1.f + expf(-v));
        break;
    }
  }
}

__global__ void activation_backward_kernel(Act act, const float* y, const float* dy, float* dx, int64_t n) {
  KILN_GRID_STRIDE(i, n) {
    const float v = y[i], g = dy[i];
    switch (act) {
      case Act::relu:
        dx[i] = v > 0.f ? g : 0.f;
        break;
      case Act::sigmoid:
        dx[i] = g * v * (1.f - v);
        break;
      case Act::tanh:
        dx[i] = g * (1.f - v * v);
        break;
      // gelu, gelu_tanh, silu: v is the forward input x
      case Act::gelu:
        dx[i] = g * (0.5f * erfcf(-v * 0.70710678118654752f) + v * 0.39894228040143268f * expf(-0.5f * v * v));
        break;
      case Act::gelu_tanh: {  // s (1 - s) = e s^2 with e = exp(-z): no cancellation in 1 - s
        const float e = expf(-2.f * 0.79788456080286536f * (v + 0.044715f * v * v * v)), sg = 1.f / (1.f + e);
        dx[i] = g * (sg + 2.f * v * (e * sg * sg) * 0.79788456080286536f * (1.f + 3.f * 0.044715f * v * v));
        break;
      }
      case Act::silu: {
        const float e = expf(-v), sg = 1.f / (1.f + e);
        dx[i] = g * (sg + v * (e * sg * sg));
        break;
      }
    }
  }
}

void activation_forward(cudaStream_t s, Act act, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  activation_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(act, x, y, n);
  KILN_CUDA_LAUNCHED("activation_forward_kernel");
}

void activation_backward(cudaStream_t s, Act act, const float* y, const float* dy, float* dx, int64_t n) {
  if (n == 0) return;
  activation_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(act, y, dy, dx, n);
  KILN_CUDA_LAUNCHED("activation_backward_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(activation) {
  register_cuda_kernel(OpKind::ActivationForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ActivationAttrs>();
                         activation_forward(op.stream, static_cast<Act>(a.act), op.in(0), op.out(0), a.count);
                       }});
  register_cuda_kernel(OpKind::ActivationBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ActivationAttrs>();
                         activation_backward(op.stream, static_cast<Act>(a.act), op.in(0), op.in(1), op.out(0),
                                             a.count);
                       }});
}

}  // namespace kiln::cuda::kernels
