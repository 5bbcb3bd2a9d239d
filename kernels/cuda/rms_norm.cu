// RMSNorm forward and backward (semantics: core/ops/rms_norm.cpp): a block per row for rstd and dx (sums in double,
// in a fixed order), a thread per column for dgamma (rows in order): reproducible, no atomics.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// x: (rows, cols), gamma: (cols) -> y: (rows, cols), rstd: (rows)
__global__ void rms_norm_forward_kernel(const float* x, const float* gamma, float* y, float* rstd, int64_t rows,
                                        int64_t cols, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    double q = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) q += static_cast<double>(xr[j]) * xr[j];
    const double rs = 1.0 / sqrt(block_reduce(q, SumOp{}) / static_cast<double>(cols) + static_cast<double>(eps));
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      y[r * cols + j] = static_cast<float>(xr[j] * rs * gamma[j]);
    if (threadIdx.x == 0) rstd[r] = static_cast<float>(rs);
  }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd
__global__ void rms_norm_backward_kernel(const float* x, const float* gamma, const float* rstd, const float* dy,
                                         float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * cols;
    const double rs = rstd[r];
    double sgx = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      sgx += static_cast<double>(dy[off + j]) * gamma[j] * x[off + j] * rs;
    const double mgx = block_reduce(sgx, SumOp{}) / static_cast<double>(cols);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[off + j] = static_cast<float>(rs * (static_cast<double>(dy[off + j]) * gamma[j] - x[off + j] * rs * mgx));
  }
}

// dgamma[c] = sum_r dy(r, c) * x(r, c) * rstd(r), rows in order
__global__ void rms_norm_param_grad_kernel(const float* x, const float* rstd, const float* dy, float* dgamma,
                                           int64_t rows, int64_t cols) {
  KILN_GRID_STRIDE(c, cols) {
    double dg = 0;
    for (int64_t r = 0; r < rows; ++r) dg += static_cast<double>(dy[r * cols + c]) * x[r * cols + c] * rstd[r];
    dgamma[c] = static_cast<float>(dg);
  }
}

unsigned rows_grid(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535)); }

void forward(const CudaOp& op) {
  const auto& a = op.attrs<LayerNormAttrs>();
  if (a.rows == 0) return;
  rms_norm_forward_kernel<<<rows_grid(a.rows), row_threads(a.cols), 0, op.stream>>>(op.in(0), op.in(1), op.out(0),
                                                                                    op.out(1), a.rows, a.cols, a.eps);
  KILN_CUDA_LAUNCHED("rms_norm_forward_kernel");
}

void backward(const CudaOp& op) {
  const auto& a = op.attrs<LayerNormAttrs>();
  if (a.cols == 0) return;
  if (a.rows > 0) {
    rms_norm_backward_kernel<<<rows_grid(a.rows), row_threads(a.cols), 0, op.stream>>>(
        op.in(0), op.in(1), op.in(2), op.in(3), op.out(0), a.rows, a.cols);
    KILN_CUDA_LAUNCHED("rms_norm_backward_kernel");
  }
  rms_norm_param_grad_kernel<<<grid_for(a.cols), kThreads, 0, op.stream>>>(op.in(0), op.in(2), op.in(3), op.out(1),
                                                                           a.rows, a.cols);
  KILN_CUDA_LAUNCHED("rms_norm_param_grad_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(rms_norm) {
  register_cuda_kernel(*find_op("rms_norm_forward"), {.run = forward});
  register_cuda_kernel(*find_op("rms_norm_backward"), {.run = backward});
}

}  // namespace kiln::cuda::kernels
