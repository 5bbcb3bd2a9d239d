// Activations forward and backward (relu, sigmoid, tanh), elementwise; both may run in place.
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

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

Support activation_supports(OpKind, const OpAttrs& attrs, const DeviceLimits&) {
  const auto& a = std::get<ActivationAttrs>(attrs);
  if (static_cast<int>(a.act) >= kActivationCount)
    return no("unknown activation " + std::to_string(static_cast<int>(a.act)));
  return {};
}

}  // namespace

KILN_VULKAN_KERNEL("activation_forward", {run_activation, activation_supports});
KILN_VULKAN_KERNEL("activation_backward", {run_activation, activation_supports});

}  // namespace kiln::vulkan
