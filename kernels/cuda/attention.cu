// The ops attention is built from that cuBLAS does not run: axis permutation, one thread per output element
// (batched GEMM is cublasGemmStridedBatchedEx in backends/cuda/gemm.cpp; causal softmax is reduce.cu's).
#include "common.cuh"

namespace kiln::cuda::kernels {
namespace {

__global__ void permute_kernel(const float* x, float* y, PermuteShape p, int64_t n) {
  KILN_GRID_STRIDE(idx, n) {
    int64_t rest = idx, src = 0;
#pragma unroll
    for (int i = 5; i >= 0; --i)
      if (i < p.rank) {
        src += (rest % p.ydims[i]) * p.steps[i];
        rest /= p.ydims[i];
      }
    y[idx] = x[src];
  }
}

}  // namespace

void permute(cudaStream_t s, const float* x, float* y, const PermuteShape& p, int64_t n) {
  if (n == 0) return;
  permute_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, p, n);
  KILN_CUDA_LAUNCHED("permute_kernel");
}

}  // namespace kiln::cuda::kernels
