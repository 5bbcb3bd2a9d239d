// Add, Mul (binary); Axpby, Scale (unary, Axpby reads y); Fill; Copy (a transfer, no kernel).
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

struct ElementwiseParams {
  uint32_t count, mode;
  float alpha, beta;
};

void run_binary(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  const ElementwiseParams p{u32(a.count), c.kind == OpKind::Add ? 0u : 1u, a.alpha, a.beta};
  e.dispatch("elementwise_binary", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(a.count));
}

void run_unary(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  const bool axpby = c.kind == OpKind::Axpby;
  const ElementwiseParams p{u32(a.count), axpby ? 0u : 1u, a.alpha, a.beta};
  e.dispatch("elementwise_unary", {rd(c.in[0]), axpby ? rw(c.out[0]) : wr(c.out[0])}, p, e.groups_for(a.count));
}

void run_fill(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  struct {
    uint32_t count;
    float value;
  } p{u32(a.count), a.alpha};
  e.dispatch("fill", {wr(c.out[0])}, p, e.groups_for(a.count));
}

// vkCmdCopyBuffer: binds no storage buffer, so no maxStorageBufferRange limit (transfer = true).
void run_copy(Encoder& e, const OpCall& c) { e.copy(c.in[0], c.out[0]); }

}  // namespace

KILN_VULKAN_KERNEL("add", {run_binary});
KILN_VULKAN_KERNEL("mul", {run_binary});
KILN_VULKAN_KERNEL("axpby", {run_unary});
KILN_VULKAN_KERNEL("scale", {run_unary});
KILN_VULKAN_KERNEL("fill", {run_fill});
// Bytes are bytes: a copy between buffers of one type needs no conversion.
KILN_VULKAN_KERNEL("copy", {.run = run_copy, .transfer = true, .takes_types = [](const OpCall& c, const DeviceLimits&) {
                              return c.in[0].dtype == c.out[0].dtype;
                            }});

}  // namespace kiln::vulkan
