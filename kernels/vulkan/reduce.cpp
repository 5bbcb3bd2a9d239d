// ReduceSum over the middle axis of (outer, reduce, inner): one invocation per output when there are many
// outputs, one workgroup per output (tree sum) when few outputs each reduce a long axis.
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_reduce(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ReduceAttrs>(c.attrs);
  const int64_t outputs = a.outer * a.inner;
  if (outputs == 0) return;
  const bool wide = outputs < 1024 && a.reduce >= 64;
  // Ranges of outputs and of the reduced axis, one dispatch each, within the loop budget (kernel_support.hpp); later
  // ranges of the axis accumulate. Wide: a workgroup per output, 64-wide steps and a 6-level tree; narrow: an
  // invocation per output in a grid-stride loop.
  const uint32_t local = wide ? 1 : 256;
  const int64_t groups = e.groups_for(outputs, local);
  const LoopSplit sp = wide ? split_loops((outputs + groups - 1) / groups, (a.reduce + 63) / 64, 8)
                            : split_loops((outputs + groups * 256 - 1) / (groups * 256), a.reduce, 0);
  const int64_t ospan = groups * local * sp.outer, rspan = wide ? 64 * sp.inner : sp.inner;
  for (int64_t o0 = 0; o0 < outputs; o0 += ospan) {
    const int64_t o1 = std::min(outputs, o0 + ospan);
    int64_t r0 = 0;
    do {
      const int64_t r1 = std::min(a.reduce, r0 + rspan);
      struct {
        uint32_t outer, reduce, inner, r0, r1, accumulate, o0, o1;
      } p{u32(a.outer), u32(a.reduce), u32(a.inner), u32(r0), u32(r1), r0 > 0, u32(o0), u32(o1)};
      const Bind y = r0 > 0 ? rw(c.out[0]) : wr(c.out[0]);
      e.dispatch(wide ? "reduce_sum_wide" : "reduce_sum", {rd(c.in[0]), y}, p, e.groups_for(o1 - o0, local));
      r0 = r1;
    } while (r0 < a.reduce);
  }
}

}  // namespace

KILN_VULKAN_KERNEL("reduce_sum", {run_reduce});

}  // namespace kiln::vulkan
