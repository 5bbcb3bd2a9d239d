// Elementwise kernels: bias add, add/mul/axpby/scale/fill, activations, dropout, and the registration of their
// ops. Built with --fmad=false: no contraction, so a*x + b*y rounds like the CPU reference does.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// ActivationAttrs::act's values, as the kernels switch over them.
enum class Act : int { relu = 0, sigmoid = 1, tanh = 2, gelu = 3, gelu_tanh = 4, silu = 5 };

// Dropout's per-step scalars: read from `dev` when it is not null (a captured CUDA graph's slot), else from the
// by-value copy.
struct DropoutParams {
  float rate;
  uint32_t seed, counter;
};

__global__ void bias_add_kernel(const float* x, const float* b, float* y, int64_t n, int64_t channels, int64_t inner) {
  KILN_GRID_STRIDE(i, n) y[i] = x[i] + b[(i / inner) % channels];
}

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n, float alpha, float beta) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * a[i] + beta * b[i];
}

__global__ void mul_kernel(const float* a, const float* b, float* y, int64_t n) {
  KILN_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}

__global__ void axpby_kernel(const float* x, float* y, int64_t n, float alpha, float beta) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * x[i] + beta * y[i];
}

__global__ void scale_kernel(const float* x, float* y, int64_t n, float alpha) {
  KILN_GRID_STRIDE(i, n) y[i] = alpha * x[i];
}

__global__ void fill_kernel(float* y, int64_t n, float value) { KILN_GRID_STRIDE(i, n) y[i] = value; }

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

// kiln_hash32 / dropout_uniform of core/include/kiln/reference.hpp, bit for bit.
__device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__global__ void dropout_kernel(const float* x, float* y, int64_t n, DropoutParams host, const DropoutParams* dev) {
  const DropoutParams p = dev ? *dev : host;
  const uint32_t key = hash32(p.counter ^ hash32(p.seed));
  const float keep_scale = 1.0f - p.rate;
  KILN_GRID_STRIDE(i, n) {
    const uint32_t h = hash32(static_cast<uint32_t>(i) ^ key);
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    y[i] = u >= p.rate ? x[i] / keep_scale : 0.0f;
  }
}

void bias_add(cudaStream_t s, const float* x, const float* b, float* y, int64_t outer, int64_t channels,
              int64_t inner) {
  const int64_t n = outer * channels * inner;
  if (n == 0) return;
  bias_add_kernel<<<grid_for(n), kThreads, 0, s>>>(x, b, y, n, channels, inner);
  KILN_CUDA_LAUNCHED("bias_add_kernel");
}

void add(cudaStream_t s, const float* a, const float* b, float* y, int64_t n, float alpha, float beta) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, y, n, alpha, beta);
  KILN_CUDA_LAUNCHED("add_kernel");
}

void mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t n) {
  if (n == 0) return;
  mul_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, y, n);
  KILN_CUDA_LAUNCHED("mul_kernel");
}

void axpby(cudaStream_t s, const float* x, float* y, int64_t n, float alpha, float beta) {
  if (n == 0) return;
  axpby_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, alpha, beta);
  KILN_CUDA_LAUNCHED("axpby_kernel");
}

}  // namespace

void scale(cudaStream_t s, const float* x, float* y, int64_t n, float alpha) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, alpha);
  KILN_CUDA_LAUNCHED("scale_kernel");
}

void fill(cudaStream_t s, float* y, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(y, n, value);
  KILN_CUDA_LAUNCHED("fill_kernel");
}

namespace {

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

void dropout(cudaStream_t s, const float* x, float* y, int64_t n, const DropoutParams& p, const DropoutParams* dev) {
  if (n == 0) return;
  dropout_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, p, dev);
  KILN_CUDA_LAUNCHED("dropout_kernel");
}

DropoutParams dropout_params(const DropoutAttrs& a) { return {a.rate, a.seed, a.counter}; }

}  // namespace

KILN_CUDA_KERNELS(elementwise) {
  register_cuda_kernel(OpKind::BiasAdd, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BiasAttrs>();
                         bias_add(op.stream, op.in(0), op.in(1), op.out(0), a.outer, a.channels, a.inner);
                       }});
  register_cuda_kernel(OpKind::Add, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         add(op.stream, op.in(0), op.in(1), op.out(0), a.count, a.alpha, a.beta);
                       }});
  register_cuda_kernel(OpKind::Mul, {.run = [](const CudaOp& op) {
                         mul(op.stream, op.in(0), op.in(1), op.out(0), op.attrs<ElementwiseAttrs>().count);
                       }});
  register_cuda_kernel(OpKind::Axpby, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         axpby(op.stream, op.in(0), op.out(0), a.count, a.alpha, a.beta);
                       }});
  register_cuda_kernel(OpKind::Scale, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         scale(op.stream, op.in(0), op.out(0), a.count, a.alpha);
                       }});
  register_cuda_kernel(OpKind::Fill, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         fill(op.stream, op.out(0), a.count, a.alpha);
                       }});
  register_cuda_kernel(OpKind::ActivationForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ActivationAttrs>();
                         activation_forward(op.stream, static_cast<Act>(a.act), op.in(0), op.out(0), a.count);
                       }});
  register_cuda_kernel(OpKind::ActivationBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ActivationAttrs>();
                         activation_backward(op.stream, static_cast<Act>(a.act), op.in(0), op.in(1), op.out(0),
                                             a.count);
                       }});
  // Forward and backward apply the same mask (the backward call carries the forward's seed and counter).
  const CudaKernel drop{
      .run =
          [](const CudaOp& op) {
            const auto& a = op.attrs<DropoutAttrs>();
            dropout(op.stream, op.in(0), op.out(0), a.count, dropout_params(a),
                    static_cast<const DropoutParams*>(op.step_scalars));
          },
      .pack_step_scalars = [](const OpCall& c,
                              void* slot) { put_step_scalars(dropout_params(std::get<DropoutAttrs>(c.attrs)), slot); }};
  register_cuda_kernel(OpKind::DropoutForward, drop);
  register_cuda_kernel(OpKind::DropoutBackward, drop);
}

}  // namespace kiln::cuda::kernels
