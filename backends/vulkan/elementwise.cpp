// Add, Mul (binary); Axpby, Scale, Copy (unary, Axpby reads y); Fill.
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_elementwise(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  const uint32_t groups = e.groups_for(a.count);
  struct {
    uint32_t count, mode;
    float alpha, beta;
  } p{u32(a.count), 0, a.alpha, a.beta};
  switch (c.kind) {
    case OpKind::Add:
    case OpKind::Mul:
      p.mode = c.kind == OpKind::Add ? 0 : 1;
      e.dispatch("elementwise_binary", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, groups);
      return;
    case OpKind::Fill: {
      struct {
        uint32_t count;
        float value;
      } f{u32(a.count), a.alpha};
      e.dispatch("fill", {wr(c.out[0])}, f, groups);
      return;
    }
    default:
      p.mode = c.kind == OpKind::Axpby ? 0 : (c.kind == OpKind::Scale ? 1 : 2);
      e.dispatch("elementwise_unary", {rd(c.in[0]), c.kind == OpKind::Axpby ? rw(c.out[0]) : wr(c.out[0])}, p,
                 groups);
  }
}

}  // namespace kiln::vulkan
