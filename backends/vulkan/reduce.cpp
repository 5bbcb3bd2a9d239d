// ReduceSum over the middle axis of (outer, reduce, inner): one invocation per output when there are many
// outputs, one workgroup per output (tree sum) when few outputs each reduce a long axis.
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_reduce(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ReduceAttrs>(c.attrs);
  const int64_t outputs = a.outer * a.inner;
  struct {
    uint32_t outer, reduce, inner;
  } p{u32(a.outer), u32(a.reduce), u32(a.inner)};
  if (outputs < 1024 && a.reduce >= 64)
    e.dispatch("reduce_sum_wide", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(outputs, 1));
  else
    e.dispatch("reduce_sum", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(outputs));
}

}  // namespace kiln::vulkan
