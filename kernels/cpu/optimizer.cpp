// Optimizer updates, one fused pass over the parameter each (PyTorch semantics, see ops.hpp).
#include <cmath>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void sgd_update(const SgdAttrs& a, const float* g, float* w, float* v, ThreadPool& pool) {
  const float lr = a.lr, mu = a.momentum, wd = a.weight_decay;
  const bool nesterov = a.nesterov;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (mu == 0.f) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else if (nesterov) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const float gp = g[i] + wd * w[i];
        const float vn = mu * v[i] + gp;
        v[i] = vn;
        w[i] -= lr * (gp + mu * vn);
      }
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const float vn = mu * v[i] + (g[i] + wd * w[i]);
        v[i] = vn;
        w[i] -= lr * vn;
      }
    }
  });
}

void adam_update(const AdamAttrs& a, const float* g, float* w, float* m, float* v, ThreadPool& pool) {
  const float b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay, eps = a.eps;
  const double t = static_cast<double>(a.step);
  const float step_size = static_cast<float>(double(a.lr) / (1.0 - std::pow(double(a.beta1), t)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(double(a.beta2), t)));
  // AdamW's decay, fused into the one pass over w: keep is exactly 1 for plain Adam (w * 1 is w, bit for bit).
  const float keep = static_cast<float>(1.0 - double(a.lr) * double(a.decoupled_decay));
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float wi = w[i] * keep;
      const float gp = g[i] + wd * wi;
      const float mn = b1 * m[i] + (1.f - b1) * gp;
      const float vn = b2 * v[i] + (1.f - b2) * gp * gp;
      m[i] = mn;
      v[i] = vn;
      w[i] = wi - step_size * mn / (std::sqrt(vn * inv_bc2) + eps);
    }
  });
}

void rmsprop_update(const RmspropAttrs& a, const float* g, float* w, float* sq, float* buf, ThreadPool& pool) {
  const float lr = a.lr, rho = a.rho, eps = a.eps, mu = a.momentum;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (mu > 0.f) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const float sn = rho * sq[i] + (1.f - rho) * g[i] * g[i];
        sq[i] = sn;
        const float bn = mu * buf[i] + g[i] / (std::sqrt(sn) + eps);
        buf[i] = bn;
        w[i] -= lr * bn;
      }
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const float sn = rho * sq[i] + (1.f - rho) * g[i] * g[i];
        sq[i] = sn;
        w[i] -= lr * g[i] / (std::sqrt(sn) + eps);
      }
    }
  });
}

void ema_update(const EmaAttrs& a, const float* w, float* shadow, ThreadPool& pool) {
  const float d = a.decay, e1 = 1.f - a.decay;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) shadow[i] = d * shadow[i] + e1 * w[i];
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("sgd_update", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<SgdAttrs>(c);
                  sgd_update(a, in(c, 0), out(c, 0), a.momentum == 0.f ? nullptr : out(c, 1), d.pool());
                }});
KILN_CPU_KERNEL("adam_update", {[](CpuDevice& d, const OpCall& c) {
                  adam_update(attrs<AdamAttrs>(c), in(c, 0), out(c, 0), out(c, 1), out(c, 2), d.pool());
                }});
KILN_CPU_KERNEL("rmsprop_update", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<RmspropAttrs>(c);
                  rmsprop_update(a, in(c, 0), out(c, 0), out(c, 1), a.momentum > 0.f ? out(c, 2) : nullptr, d.pool());
                }});
KILN_CPU_KERNEL("ema_update",
                {[](CpuDevice& d, const OpCall& c) { ema_update(attrs<EmaAttrs>(c), in(c, 0), out(c, 0), d.pool()); }});

}  // namespace kiln::cpu
