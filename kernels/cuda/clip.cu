// Gradient clipping by global norm: the sum of squares of a gradient (one block, double accumulation in a fixed
// order, so results are reproducible) and the clip scale (PyTorch's clip_grad_norm_ coefficient).
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__global__ void sum_squares_kernel(const float* x, float* y, int64_t n, float alpha, float beta) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(x[i]) * x[i];
  acc = block_reduce(acc, SumOp{});
  if (threadIdx.x == 0) {
    const double prev = beta != 0.f ? static_cast<double>(beta) * y[0] : 0.0;
    y[0] = static_cast<float>(static_cast<double>(alpha) * acc + prev);
  }
}

__global__ void clip_by_global_norm_kernel(const float* s, float* x, int64_t n, float max_norm) {
  float coef = max_norm / (sqrtf(s[0]) + 1e-6f);
  coef = coef > 1.f ? 1.f : coef;  // NaN stays NaN, as torch.clamp leaves it
  KILN_GRID_STRIDE(i, n) x[i] *= coef;
}

// y = alpha * sum x^2 + beta * y; x *= min(1, max_norm / (sqrt(sumsq) + 1e-6)).
void sum_squares(cudaStream_t s, const float* x, float* y, int64_t n, float alpha, float beta) {
  sum_squares_kernel<<<1, kThreads, 0, s>>>(x, y, n, alpha, beta);
  KILN_CUDA_LAUNCHED("sum_squares_kernel");
}

void clip_by_global_norm(cudaStream_t s, const float* sumsq, float* x, int64_t n, float max_norm) {
  if (n == 0) return;
  clip_by_global_norm_kernel<<<grid_for(n), kThreads, 0, s>>>(sumsq, x, n, max_norm);
  KILN_CUDA_LAUNCHED("clip_by_global_norm_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(clip) {
  register_cuda_kernel(OpKind::SumSquares, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         sum_squares(op.stream, op.in(0), op.out(0), a.count, a.alpha, a.beta);
                       }});
  register_cuda_kernel(OpKind::ClipByGlobalNorm, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ElementwiseAttrs>();
                         clip_by_global_norm(op.stream, op.in(0), op.out(0), a.count, a.alpha);
                       }});
}

}  // namespace kiln::cuda::kernels
