// BiasAdd (elementwise, may run in place) and BiasGrad (a workgroup tree sum per channel).
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_bias(Encoder& e, const OpCall& c) {
  const auto& a = std::get<BiasAttrs>(c.attrs);
  if (c.kind == OpKind::BiasAdd) {
    const int64_t count = a.outer * a.channels * a.inner;
    if (count == 0) return;
    struct {
      uint32_t count, channels, inner;
    } p{u32(count), u32(a.channels), u32(a.inner)};
    e.dispatch("bias_add", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(count));
    return;
  }
  if (a.channels == 0) return;
  struct {
    uint32_t outer, channels, inner;
  } p{u32(a.outer), u32(a.channels), u32(a.inner)};
  e.dispatch("bias_grad", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.channels, 1));
}

}  // namespace kiln::vulkan
