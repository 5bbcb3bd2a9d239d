// Row-wise softmax, with attention's causal mask where SoftmaxAttrs::causal asks for it, and the registration of its
// ops. One block per row; sums accumulate in double in a fixed order, so results are reproducible and close to the
// reference (which sums in double).
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

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

KILN_CUDA_KERNELS(softmax) {
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
