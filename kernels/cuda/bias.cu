// Bias add and its gradient, a per-channel sum accumulated in double in a fixed order (reproducible, and close to the
// reference, which sums in double); and the registration of their ops.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__global__ void bias_add_kernel(const float* x, const float* b, float* y, int64_t n, int64_t channels, int64_t inner) {
  KILN_GRID_STRIDE(i, n) y[i] = x[i] + b[(i / inner) % channels];
}

// db[c] = sum over (o, i) of dy(o, c, i), one block per channel (inner > 1: coalesced over i).
__global__ void bias_grad_kernel(const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner) {
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < outer * inner; j += blockDim.x) {
      const int64_t o = j / inner, i = j % inner;
      acc += dy[(o * channels + c) * inner + i];
    }
    acc = block_reduce(acc, SumOp{});
    if (threadIdx.x == 0) db[c] = static_cast<float>(acc);
  }
}

void bias_add(cudaStream_t s, const float* x, const float* b, float* y, int64_t outer, int64_t channels,
              int64_t inner) {
  const int64_t n = outer * channels * inner;
  if (n == 0) return;
  bias_add_kernel<<<grid_for(n), kThreads, 0, s>>>(x, b, y, n, channels, inner);
  KILN_CUDA_LAUNCHED("bias_add_kernel");
}

void bias_grad(cudaStream_t s, const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner) {
  if (channels == 0) return;
  if (inner == 1) return reduce_sum(s, dy, db, 1, outer, channels);  // dy(outer, channels): column sums
  bias_grad_kernel<<<row_grid(channels), kThreads, 0, s>>>(dy, db, outer, channels, inner);
  KILN_CUDA_LAUNCHED("bias_grad_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(bias) {
  register_cuda_kernel(OpKind::BiasAdd, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BiasAttrs>();
                         bias_add(op.stream, op.in(0), op.in(1), op.out(0), a.outer, a.channels, a.inner);
                       }});
  register_cuda_kernel(OpKind::BiasGrad, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BiasAttrs>();
                         bias_grad(op.stream, op.in(0), op.out(0), a.outer, a.channels, a.inner);
                       }});
}

}  // namespace kiln::cuda::kernels
