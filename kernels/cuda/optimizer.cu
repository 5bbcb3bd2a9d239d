// Optimizer updates and EMA, one fused kernel each, in double like the reference (built with --fmad=false, so
// the update rounds exactly as the CPU reference does).
#include <cmath>
#include <string>

#include "common.cuh"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

// The scalars of each update, which change every step (learning rate, Adam's t). A kernel reads them from `dev`
// when it is not null (the call's slot in a captured CUDA graph, rewritten before each replay) and from the
// by-value copy otherwise.
struct SgdParams {
  float lr, momentum, weight_decay;
  int nesterov;
};
struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  double bias1, bias2;    // 1 - beta1^t, 1 - beta2^t
  float decoupled_decay;  // AdamW: w *= 1 - lr * decoupled_decay first
};
struct RmspropParams {
  float lr, rho, eps, momentum;
};
struct EmaParams {
  float decay;
};

SgdParams sgd_params(const SgdAttrs& a) { return {a.lr, a.momentum, a.weight_decay, a.nesterov ? 1 : 0}; }
AdamParams adam_params(const AdamAttrs& a) {
  // Bias corrections in double on the host, exactly as the reference computes them.
  const double t = static_cast<double>(a.step);
  return {a.lr,
          a.beta1,
          a.beta2,
          a.eps,
          a.weight_decay,
          1.0 - std::pow(double(a.beta1), t),
          1.0 - std::pow(double(a.beta2), t),
          a.decoupled_decay};
}
RmspropParams rmsprop_params(const RmspropAttrs& a) { return {a.lr, a.rho, a.eps, a.momentum}; }
EmaParams ema_params(const EmaAttrs& a) { return {a.decay}; }

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

}  // namespace

KILN_CUDA_KERNELS(optimizer) {
  register_cuda_kernel(OpKind::SgdUpdate, {.run =
                                               [](const CudaOp& op) {
                                                 const auto& a = op.attrs<SgdAttrs>();
                                                 sgd(op.stream, op.in(0), op.out(0), op.out(1), a.count, sgd_params(a),
                                                     static_cast<const SgdParams*>(op.step_scalars));
                                               },
                                           .pack_step_scalars =
                                               [](const OpCall& c, void* slot) {
                                                 put_step_scalars(sgd_params(std::get<SgdAttrs>(c.attrs)), slot);
                                               }});
  register_cuda_kernel(
      OpKind::AdamUpdate,
      {.run =
           [](const CudaOp& op) {
             const auto& a = op.attrs<AdamAttrs>();
             adam(op.stream, op.in(0), op.out(0), op.out(1), op.out(2), a.count, adam_params(a),
                  static_cast<const AdamParams*>(op.step_scalars));
           },
       .support =
           [](OpKind, const OpAttrs& attrs) {
             const auto& a = std::get<AdamAttrs>(attrs);
             if (a.step < 1) return Support{false, "adam_update needs step t >= 1, found " + std::to_string(a.step)};
             return Support{};
           },
       .pack_step_scalars = [](const OpCall& c,
                               void* slot) { put_step_scalars(adam_params(std::get<AdamAttrs>(c.attrs)), slot); }});
  register_cuda_kernel(OpKind::RmspropUpdate,
                       {.run =
                            [](const CudaOp& op) {
                              const auto& a = op.attrs<RmspropAttrs>();
                              rmsprop(op.stream, op.in(0), op.out(0), op.out(1), op.out(2), a.count, rmsprop_params(a),
                                      static_cast<const RmspropParams*>(op.step_scalars));
                            },
                        .pack_step_scalars =
                            [](const OpCall& c, void* slot) {
                              put_step_scalars(rmsprop_params(std::get<RmspropAttrs>(c.attrs)), slot);
                            }});
  register_cuda_kernel(OpKind::EmaUpdate, {.run =
                                               [](const CudaOp& op) {
                                                 const auto& a = op.attrs<EmaAttrs>();
                                                 ema(op.stream, op.in(0), op.out(0), a.count, ema_params(a),
                                                     static_cast<const EmaParams*>(op.step_scalars));
                                               },
                                           .pack_step_scalars =
                                               [](const OpCall& c, void* slot) {
                                                 put_step_scalars(ema_params(std::get<EmaAttrs>(c.attrs)), slot);
                                               }});
}

}  // namespace kiln::cuda::kernels
