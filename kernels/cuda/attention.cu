// The ops attention is built from that cuBLAS does not run: axis permutation, one thread per output element
// (batched GEMM is cublasGemmStridedBatchedEx in gemm.cu; causal softmax is softmax.cu's).
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// y = x with permuted axes; y's axis i has ydims[i] entries, x stride steps[i] (rank <= 6).
struct PermuteShape {
  int rank;
  int64_t ydims[6], steps[6];
};
static_assert(kPermuteMaxRank <= 6);

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

void permute(cudaStream_t s, const float* x, float* y, const PermuteShape& p, int64_t n) {
  if (n == 0) return;
  permute_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, p, n);
  KILN_CUDA_LAUNCHED("permute_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(attention) {
  register_cuda_kernel(OpKind::Permute, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<PermuteAttrs>();
                         PermuteShape p{static_cast<int>(a.rank), {}, {}};
                         int64_t xstride[kPermuteMaxRank], n = 1;
                         for (int64_t i = a.rank - 1; i >= 0; --i) xstride[i] = n, n *= a.dims[i];
                         for (int64_t i = 0; i < a.rank; ++i)
                           p.ydims[i] = a.dims[a.perm[i]], p.steps[i] = xstride[a.perm[i]];
                         permute(op.stream, op.in(0), op.out(0), p, n);
                       }});
}

}  // namespace kiln::cuda::kernels
