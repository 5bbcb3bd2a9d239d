// Reductions (ReduceSum over the middle axis). Sums accumulate in double in a fixed order, so results are
// reproducible and close to the reference (which sums in double).
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// y(o, i) = sum_r x(o, r, i), one thread per output: coalesced over i.
__global__ void reduce_columns_kernel(const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner) {
  KILN_GRID_STRIDE(idx, outer * inner) {
    const int64_t o = idx / inner, i = idx % inner;
    const float* src = x + o * reduce * inner + i;
    double acc = 0;
    for (int64_t r = 0; r < reduce; ++r) acc += src[r * inner];
    y[idx] = static_cast<float>(acc);
  }
}

// y(o, i) = sum_r x(o, r, i), one block per output: for long reductions over few outputs.
__global__ void reduce_rows_kernel(const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner) {
  for (int64_t idx = blockIdx.x; idx < outer * inner; idx += gridDim.x) {
    const int64_t o = idx / inner, i = idx % inner;
    const float* src = x + o * reduce * inner + i;
    double acc = 0;
    for (int64_t r = threadIdx.x; r < reduce; r += blockDim.x) acc += src[r * inner];
    acc = block_reduce(acc, SumOp{});
    if (threadIdx.x == 0) y[idx] = static_cast<float>(acc);
  }
}

}  // namespace

void reduce_sum(cudaStream_t s, const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  // Few outputs with long sums: a block per output; otherwise a thread per output.
  if (outputs < 16384 && reduce >= 64) {
    reduce_rows_kernel<<<row_grid(outputs), kThreads, 0, s>>>(x, y, outer, reduce, inner);
    KILN_CUDA_LAUNCHED("reduce_rows_kernel");
  } else {
    reduce_columns_kernel<<<grid_for(outputs), kThreads, 0, s>>>(x, y, outer, reduce, inner);
    KILN_CUDA_LAUNCHED("reduce_columns_kernel");
  }
}

KILN_CUDA_KERNELS(reduce) {
  register_cuda_kernel(OpKind::ReduceSum, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ReduceAttrs>();
                         reduce_sum(op.stream, op.in(0), op.out(0), a.outer, a.reduce, a.inner);
                       }});
}

}  // namespace kiln::cuda::kernels
