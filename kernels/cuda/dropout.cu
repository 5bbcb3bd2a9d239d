// Dropout: the mask comes from a counter-based hash of (seed, counter, index), so forward and backward draw the same
// mask, bit for bit like the CPU reference; and the registration of its ops.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// Dropout's per-step scalars: read from `dev` when it is not null (a captured CUDA graph's slot), else from the
// by-value copy.
struct DropoutParams {
  float rate;
  uint32_t seed, counter;
};

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

void dropout(cudaStream_t s, const float* x, float* y, int64_t n, const DropoutParams& p, const DropoutParams* dev) {
  if (n == 0) return;
  dropout_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n, p, dev);
  KILN_CUDA_LAUNCHED("dropout_kernel");
}

DropoutParams dropout_params(const DropoutAttrs& a) { return {a.rate, a.seed, a.counter}; }

}  // namespace

KILN_CUDA_KERNELS(dropout) {
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
