// Batch norm forward and backward: a block per channel (channels grid-strided), sums in double in a fixed order
// (reproducible, no atomics). A channel's element k is x[(k / inner * c + ch) * inner + k % inner].
#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

__device__ inline int64_t bn_index(int64_t k, int64_t ch, int64_t c, int64_t inner) {
  const int64_t o = k / inner;
  return (o * c + ch) * inner + (k - o * inner);
}

__global__ void batch_norm_forward_kernel(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                          float* rstd, float* running_mean, float* running_var, int64_t n, int64_t c,
                                          int64_t inner, float eps, float momentum, bool training) {
  const int64_t m = n * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double mu, rs;
    if (training) {
      double s = 0;
      for (int64_t k = threadIdx.x; k < m; k += blockDim.x) s += x[bn_index(k, ch, c, inner)];
      mu = block_reduce(s, SumOp{}) / static_cast<double>(m);
      double q = 0;
      for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
        const double d = x[bn_index(k, ch, c, inner)] - mu;
        q += d * d;
      }
      const double var = block_reduce(q, SumOp{}) / static_cast<double>(m);
      rs = 1.0 / sqrt(var + static_cast<double>(eps));
      if (threadIdx.x == 0) {
        const double mom = momentum, unbiased = m > 1 ? var * m / (m - 1) : var;
        running_mean[ch] = static_cast<float>((1.0 - mom) * running_mean[ch] + mom * mu);
        running_var[ch] = static_cast<float>((1.0 - mom) * running_var[ch] + mom * unbiased);
      }
    } else {
      mu = running_mean[ch];
      rs = 1.0 / sqrt(static_cast<double>(running_var[ch]) + static_cast<double>(eps));
    }
    const double g = gamma[ch], b = beta[ch];
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t j = bn_index(k, ch, c, inner);
      y[j] = static_cast<float>((x[j] - mu) * rs * g + b);
    }
    if (threadIdx.x == 0) {
      mean[ch] = static_cast<float>(mu);
      rstd[ch] = static_cast<float>(rs);
    }
  }
}

__global__ void batch_norm_backward_kernel(const float* x, const float* gamma, const float* mean, const float* rstd,
                                           const float* dy, float* dx, float* dgamma, float* dbeta, int64_t n,
                                           int64_t c, int64_t inner, bool training) {
  const int64_t m = n * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double mu = mean[ch], rs = rstd[ch], ga = gamma[ch];
    double sdy = 0, sdyx = 0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t j = bn_index(k, ch, c, inner);
      sdy += dy[j];
      sdyx += static_cast<double>(dy[j]) * (x[j] - mu) * rs;
    }
    sdy = block_reduce(sdy, SumOp{});
    sdyx = block_reduce(sdyx, SumOp{});
    const double mg = training && m > 0 ? ga * sdy / m : 0.0, mgx = training && m > 0 ? ga * sdyx / m : 0.0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const int64_t j = bn_index(k, ch, c, inner);
      dx[j] = static_cast<float>(rs * (static_cast<double>(dy[j]) * ga - mg - (x[j] - mu) * rs * mgx));
    }
    if (threadIdx.x == 0) {
      dgamma[ch] = static_cast<float>(sdyx);
      dbeta[ch] = static_cast<float>(sdy);
    }
  }
}

unsigned channels_grid(int64_t c) { return static_cast<unsigned>(std::clamp<int64_t>(c, 1, 65535)); }

// x viewed as (n, c, inner); training updates the running statistics in place.

void batch_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* rstd, float* running_mean, float* running_var, int64_t n, int64_t c, int64_t inner,
                        float eps, float momentum, bool training) {
  if (c == 0) return;
  batch_norm_forward_kernel<<<channels_grid(c), row_threads(n * inner), 0, s>>>(
      x, gamma, beta, y, mean, rstd, running_mean, running_var, n, c, inner, eps, momentum, training);
  KILN_CUDA_LAUNCHED("batch_norm_forward_kernel");
}

void batch_norm_backward(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dgamma, float* dbeta, int64_t n, int64_t c, int64_t inner,
                         bool training) {
  if (c == 0) return;
  batch_norm_backward_kernel<<<channels_grid(c), row_threads(n * inner), 0, s>>>(x, gamma, mean, rstd, dy, dx, dgamma,
                                                                                 dbeta, n, c, inner, training);
  KILN_CUDA_LAUNCHED("batch_norm_backward_kernel");
}

}  // namespace

KILN_CUDA_KERNELS(batch_norm) {
  register_cuda_kernel(OpKind::BatchNormForward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BatchNormAttrs>();
                         batch_norm_forward(op.stream, op.in(0), op.in(1), op.in(2), op.out(0), op.out(1), op.out(2),
                                            op.out(3), op.out(4), a.n, a.c, a.inner, a.eps, a.momentum, a.training);
                       }});
  register_cuda_kernel(OpKind::BatchNormBackward, {.run = [](const CudaOp& op) {
                         const auto& a = op.attrs<BatchNormAttrs>();
                         batch_norm_backward(op.stream, op.in(0), op.in(1), op.in(2), op.in(3), op.in(4), op.out(0),
                                             op.out(1), op.out(2), a.n, a.c, a.inner, a.training);
                       }});
}

}  // namespace kiln::cuda::kernels
