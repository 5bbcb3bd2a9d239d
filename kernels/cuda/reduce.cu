// Reductions (bias gradient, ReduceSum) and row-wise softmax. Sums accumulate in double in a fixed order, so
// results are reproducible and close to the reference (which sums in double).
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

// causal: row r keeps columns j <= r % cols (attention's mask), the others get 0.
__global__ void softmax_forward_kernel(const float* x, float* y, int64_t rows, int64_t cols, bool causal) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const int64_t valid = causal ? r % cols + 1 : cols;
    double mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) mx = fmax(mx, static_cast<double>(xr[j]));
    mx = block_reduce(mx, MaxOp{});
    double sum = 0;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += exp(static_cast<double>(xr[j]) - mx);
    sum = block_reduce(sum, SumOp{});
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      yr[j] = j < valid ? static_cast<float>(exp(static_cast<double>(xr[j]) - mx) / sum) : 0.f;
  }
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * cols;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += static_cast<double>(dy[off + j]) * y[off + j];
    dot = block_reduce(dot, SumOp{});
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[off + j] = static_cast<float>(static_cast<double>(y[off + j]) * (dy[off + j] - dot));
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535)); }

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

void bias_grad(cudaStream_t s, const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner) {
  if (channels == 0) return;
  if (inner == 1) return reduce_sum(s, dy, db, 1, outer, channels);  // dy(outer, channels): column sums
  bias_grad_kernel<<<row_grid(channels), kThreads, 0, s>>>(dy, db, outer, channels, inner);
  KILN_CUDA_LAUNCHED("bias_grad_kernel");
}

// causal: row r keeps columns j <= r % cols, the others get 0 (attention's mask).
void softmax_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols, bool causal) {
  if (rows == 0 || cols == 0) return;
  softmax_forward_kernel<<<row_grid(rows), row_threads(cols), 0, s>>>(x, y, rows, cols, causal);
  KILN_CUDA_LAUNCHED("softmax_forward_kernel");
}

void softmax_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<row_grid(rows), row_threads(cols), 0, s>>>(y, dy, dx, rows, cols);
  KILN_CUDA_LAUNCHED("softmax_backward_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(reduce) {
  register_cuda_kernel(OpKind::BiasGrad, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BiasAttrs>();
                         bias_grad(op.stream, op.in(0), op.out(0), a.outer, a.channels, a.inner);
                       }});
  register_cuda_kernel(OpKind::ReduceSum, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<ReduceAttrs>();
                         reduce_sum(op.stream, op.in(0), op.out(0), a.outer, a.reduce, a.inner);
                       }});
  register_cuda_kernel(OpKind::SoftmaxForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<SoftmaxAttrs>();
                         softmax_forward(op.stream, op.in(0), op.out(0), a.rows, a.cols, a.causal);
                       }});
  register_cuda_kernel(OpKind::SoftmaxBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<SoftmaxAttrs>();
                         softmax_backward(op.stream, op.in(0), op.in(1), op.out(0), a.rows, a.cols);
                       }});
}

}  // namespace kiln::cuda::kernels
