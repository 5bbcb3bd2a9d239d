// Optimizer updates and EMA, one fused kernel each, in double like the reference (built with --fmad=false, so
// the update rounds exactly as the CPU reference does). Scalars come from the device slot when the call is part
// of a replayed CUDA graph (see kernels.hpp).
#include "common.cuh"

namespace kiln::cuda::kernels {
namespace {

__global__ void sgd_kernel(const float* g, float* w, float* v, int64_t n, SgdParams host, const SgdParams* dev) {
  const SgdParams p = dev ? *dev : host;
  const double lr = p.lr, mom = p.momentum, wd = p.weight_decay;
  KILN_GRID_STRIDE(i, n) {
    const double gp = static_cast<double>(g[i]) + wd * w[i];
    double d = gp;
    if (p.momentum != 0.f) {  // otherwise v is untouched (it may even alias w)
      const double vn = mom * v[i] + gp;
      v[i] = static_cast<float>(vn);
      d = p.nesterov ? gp + mom * vn : vn;
    }
    w[i] = static_cast<float>(w[i] - lr * d);
  }
}

__global__ void adam_kernel(const float* g, float* w, float* m, float* v, int64_t n, AdamParams host,
                            const AdamParams* dev) {
  const AdamParams p = dev ? *dev : host;
  const double b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay;
  const double keep = 1.0 - lr * static_cast<double>(p.decoupled_decay);  // AdamW
  KILN_GRID_STRIDE(i, n) {
    if (p.decoupled_decay != 0.f) w[i] = static_cast<float>(w[i] * keep);
    const double gp = static_cast<double>(g[i]) + wd * w[i];
    const double mn = b1 * m[i] + (1.0 - b1) * gp;
    const double vn = b2 * v[i] + (1.0 - b2) * gp * gp;
    m[i] = static_cast<float>(mn);
    v[i] = static_cast<float>(vn);
    w[i] = static_cast<float>(w[i] - lr * (mn / p.bias1) / (sqrt(vn / p.bias2) + eps));
  }
}

__global__ void rmsprop_kernel(const float* g, float* w, float* sq, float* buf, int64_t n, RmspropParams host,
                               const RmspropParams* dev) {
  const RmspropParams p = dev ? *dev : host;
  const double rho = p.rho, lr = p.lr, eps = p.eps, mom = p.momentum;
  KILN_GRID_STRIDE(i, n) {
    const double gi = g[i];
    const double sn = rho * sq[i] + (1.0 - rho) * gi * gi;
    sq[i] = static_cast<float>(sn);
    const double step = gi / (sqrt(sn) + eps);
    if (p.momentum > 0.f) {  // otherwise buf is untouched (it may alias another buffer)
      const double bn = mom * buf[i] + step;
      buf[i] = static_cast<float>(bn);
      w[i] = static_cast<float>(w[i] - lr * bn);
    } else {
      w[i] = static_cast<float>(w[i] - lr * step);
    }
  }
}

__global__ void ema_kernel(const float* w, float* shadow, int64_t n, EmaParams host, const EmaParams* dev) {
  const double d = (dev ? *dev : host).decay;
  KILN_GRID_STRIDE(i, n) shadow[i] = static_cast<float>(d * shadow[i] + (1.0 - d) * w[i]);
}

}  // namespace

void sgd(cudaStream_t s, const float* g, float* w, float* v, int64_t n, const SgdParams& p, const SgdParams* dev) {
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, s>>>(g, w, v, n, p, dev);
  KILN_CUDA_LAUNCHED("sgd_kernel");
}

void adam(cudaStream_t s, const float* g, float* w, float* m, float* v, int64_t n, const AdamParams& p,
          const AdamParams* dev) {
  if (n == 0) return;
  adam_kernel<<<grid_for(n), kThreads, 0, s>>>(g, w, m, v, n, p, dev);
  KILN_CUDA_LAUNCHED("adam_kernel");
}

void rmsprop(cudaStream_t s, const float* g, float* w, float* sq, float* buf, int64_t n, const RmspropParams& p,
             const RmspropParams* dev) {
  if (n == 0) return;
  rmsprop_kernel<<<grid_for(n), kThreads, 0, s>>>(g, w, sq, buf, n, p, dev);
  KILN_CUDA_LAUNCHED("rmsprop_kernel");
}

void ema(cudaStream_t s, const float* w, float* shadow, int64_t n, const EmaParams& p, const EmaParams* dev) {
  if (n == 0) return;
  ema_kernel<<<grid_for(n), kThreads, 0, s>>>(w, shadow, n, p, dev);
  KILN_CUDA_LAUNCHED("ema_kernel");
}

}  // namespace kiln::cuda::kernels
