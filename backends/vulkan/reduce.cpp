// ReduceSum over the middle axis of (outer, reduce, inner): one invocation per output when there are many
// outputs, one workgroup per output (tree sum) when few outputs each reduce a long axis.
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_reduce(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ReduceAttrs>(c.attrs);
  const int64_t outputs = a.outer * a.inner;
  const bool wide = outputs < 1024 && a.reduce >= 64;
  // Each dispatch sums a slice of the reduced axis short enough for one shader loop; later slices accumulate.
  const int64_t slice = wide ? 64 * kMaxLoop : kMaxLoop;
  int64_t r0 = 0;
  do {
    const int64_t r1 = std::min(a.reduce, r0 + slice);
    struct {
      uint32_t outer, reduce, inner, r0, r1, accumulate;
    } p{u32(a.outer), u32(a.reduce), u32(a.inner), u32(r0), u32(r1), r0 > 0};
    const Bind y = r0 > 0 ? rw(c.out[0]) : wr(c.out[0]);
    if (wide)
      e.dispatch("reduce_sum_wide", {rd(c.in[0]), y}, p, e.groups_for(outputs, 1));
    else
      e.dispatch("reduce_sum", {rd(c.in[0]), y}, p, e.groups_for(outputs));
    r0 = r1;
  } while (r0 < a.reduce);
}

}  // namespace kiln::vulkan
