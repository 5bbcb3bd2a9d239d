// Activations forward and backward (relu, sigmoid, tanh), elementwise; both may run in place.
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_activation(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ActivationAttrs>(c.attrs);
  struct {
    uint32_t count, act;
  } p{u32(a.count), static_cast<uint32_t>(a.act)};
  if (c.kind == OpKind::ActivationForward)
    e.dispatch("activation_forward", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.count));
  else
    e.dispatch("activation_backward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(a.count));
}

}  // namespace kiln::vulkan
