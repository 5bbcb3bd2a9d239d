// Optimizer updates (SGD with momentum/Nesterov, Adam, RMSprop) and EMA, elementwise over the parameters.
#include <cmath>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_optimizer(Encoder& e, const OpCall& c) {
  switch (c.kind) {
    case OpKind::SgdUpdate: {
      const auto& a = std::get<SgdAttrs>(c.attrs);
      struct {
        uint32_t count;
        float lr, momentum, weight_decay;
        uint32_t nesterov;
      } p{u32(a.count), a.lr, a.momentum, a.weight_decay, a.nesterov};
      e.dispatch("sgd", {rd(c.in[0]), rw(c.out[0]), rw(c.out[1])}, p, e.groups_for(a.count));
      return;
    }
    case OpKind::AdamUpdate: {
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
      return;
    }
    case OpKind::RmspropUpdate: {
      const auto& a = std::get<RmspropAttrs>(c.attrs);
      struct {
        uint32_t count;
        float lr, rho, eps, momentum;
      } p{u32(a.count), a.lr, a.rho, a.eps, a.momentum};
      e.dispatch("rmsprop", {rd(c.in[0]), rw(c.out[0]), rw(c.out[1]), rw(c.out[2])}, p, e.groups_for(a.count));
      return;
    }
    default: {
      const auto& a = std::get<EmaAttrs>(c.attrs);
      struct {
        uint32_t count;
        float decay;
      } p{u32(a.count), a.decay};
      e.dispatch("ema", {rd(c.in[0]), rw(c.out[0])}, p, e.groups_for(a.count));
    }
  }
}

}  // namespace kiln::vulkan
