// Optimizer updates (SGD with momentum/Nesterov, Adam, RMSprop) and EMA, elementwise over the parameters.
#include <cmath>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_sgd(Encoder& e, const OpCall& c) {
  const auto& a = std::get<SgdAttrs>(c.attrs);
  struct {
    uint32_t count;
    float lr, momentum, weight_decay;
    uint32_t nesterov;
  } p{u32(a.count), a.lr, a.momentum, a.weight_decay, a.nesterov};
  e.dispatch("sgd", {rd(c.in[0]), rw(c.out[0]), rw(c.out[1])}, p, e.groups_for(a.count));
}

void run_adam(Encoder& e, const OpCall& c) {
  const auto& a = std::get<AdamAttrs>(c.attrs);
  const double t = static_cast<double>(a.step);  // bias corrections in double, as the reference
  struct {
    uint32_t count;
    float lr, beta1, beta2, eps, weight_decay, bc1, bc2, keep;
  } p{u32(a.count),
      a.lr,
      a.beta1,
      a.beta2,
      a.eps,
      a.weight_decay,
      static_cast<float>(1.0 - std::pow(double(a.beta1), t)),
      static_cast<float>(1.0 - std::pow(double(a.beta2), t)),
      static_cast<float>(1.0 - double(a.lr) * double(a.decoupled_decay))};
  e.dispatch("adam", {rd(c.in[0]), rw(c.out[0]), rw(c.out[1]), rw(c.out[2])}, p, e.groups_for(a.count));
}

void run_rmsprop(Encoder& e, const OpCall& c) {
  const auto& a = std::get<RmspropAttrs>(c.attrs);
  struct {
    uint32_t count;
    float lr, rho, eps, momentum;
  } p{u32(a.count), a.lr, a.rho, a.eps, a.momentum};
  e.dispatch("rmsprop", {rd(c.in[0]), rw(c.out[0]), rw(c.out[1]), rw(c.out[2])}, p, e.groups_for(a.count));
}

void run_ema(Encoder& e, const OpCall& c) {
  const auto& a = std::get<EmaAttrs>(c.attrs);
  struct {
    uint32_t count;
    float decay;
  } p{u32(a.count), a.decay};
  e.dispatch("ema", {rd(c.in[0]), rw(c.out[0])}, p, e.groups_for(a.count));
}

}  // namespace

KILN_VULKAN_KERNEL("sgd_update", {run_sgd});
KILN_VULKAN_KERNEL("adam_update", {run_adam});
KILN_VULKAN_KERNEL("rmsprop_update", {run_rmsprop});
KILN_VULKAN_KERNEL("ema_update", {run_ema});

}  // namespace kiln::vulkan
