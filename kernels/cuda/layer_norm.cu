// Layer norm forward and backward: a block per row for the statistics and dx (sums in double, in a fixed
// order), a thread per column for the parameter gradients (rows in order): reproducible, no atomics.
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                          float* rstd, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double s = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
    const double m = block_reduce(s, SumOp{}) / static_cast<double>(cols);
    double q = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) q += (xr[j] - m) * (xr[j] - m);
    const double rs = 1.0 / sqrt(block_reduce(q, SumOp{}) / static_cast<double>(cols) + static_cast<double>(eps));
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      double v = (xr[j] - m) * rs * gamma[j];
      if (beta) v += beta[j];
      yr[j] = static_cast<float>(v);
    }
    if (threadIdx.x == 0) {
      mean[r] = static_cast<float>(m);
      rstd[r] = static_cast<float>(rs);
    }
  }
}

__global__ void layer_norm_backward_kernel(const float* x, const float* gamma, const float* mean, const float* rstd,
                                           const float* dy, float* dx, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t off = r * cols;
    const double m = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const double g = static_cast<double>(dy[off + j]) * gamma[j];
      sg += g;
      sgx += g * (x[off + j] - m) * rs;
    }
    const double mg = block_reduce(sg, SumOp{}) / static_cast<double>(cols);
    const double mgx = block_reduce(sgx, SumOp{}) / static_cast<double>(cols);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[off + j] =
          static_cast<float>(rs * (static_cast<double>(dy[off + j]) * gamma[j] - mg - (x[off + j] - m) * rs * mgx));
  }
}

__global__ void layer_norm_param_grad_kernel(const float* x, const float* mean, const float* rstd, const float* dy,
                                             float* dgamma, float* dbeta, int64_t rows, int64_t cols) {
  KILN_GRID_STRIDE(c, cols) {
    double dg = 0, db = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double d = dy[r * cols + c];
      dg += d * (x[r * cols + c] - static_cast<double>(mean[r])) * rstd[r];
      db += d;
    }
    dgamma[c] = static_cast<float>(dg);
    if (dbeta) dbeta[c] = static_cast<float>(db);
  }
}

unsigned rows_grid(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535)); }

// beta / dbeta null without bias

void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* rstd, int64_t rows, int64_t cols, float eps) {
  if (rows == 0) return;
  layer_norm_forward_kernel<<<rows_grid(rows), row_threads(cols), 0, s>>>(x, gamma, beta, y, mean, rstd, rows, cols,
                                                                          eps);
  KILN_CUDA_LAUNCHED("layer_norm_forward_kernel");
}

void layer_norm_backward(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols) {
  if (cols == 0) return;
  if (rows > 0) {
    layer_norm_backward_kernel<<<rows_grid(rows), row_threads(cols), 0, s>>>(x, gamma, mean, rstd, dy, dx, rows, cols);
    KILN_CUDA_LAUNCHED("layer_norm_backward_kernel");
  }
  layer_norm_param_grad_kernel<<<grid_for(cols), kThreads, 0, s>>>(x, mean, rstd, dy, dgamma, dbeta, rows, cols);
  KILN_CUDA_LAUNCHED("layer_norm_param_grad_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(layer_norm) {
  register_cuda_kernel(OpKind::LayerNormForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<LayerNormAttrs>();
                         layer_norm_forward(op.stream, op.in(0), op.in(1), a.bias ? op.in(2) : nullptr, op.out(0),
                                            op.out(1), op.out(2), a.rows, a.cols, a.eps);
                       }});
  register_cuda_kernel(OpKind::LayerNormBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<LayerNormAttrs>();
                         layer_norm_backward(op.stream, op.in(0), op.in(1), op.in(2), op.in(3), op.in(4), op.out(0),
                                             op.out(1), a.bias ? op.out(2) : nullptr, a.rows, a.cols);
                       }});
}

}  // namespace kiln::cuda::kernels
