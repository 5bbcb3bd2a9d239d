// BiasAdd (elementwise, may run in place) and BiasGrad (a workgroup tree sum per channel).
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

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
  // Ranges of channels and of the summed (o, i) items, one dispatch each, within the loop budget: each workgroup
  // walks its channels, each summing up to `inner` 64-wide steps plus a 6-level tree; later item ranges add to db.
  const int64_t n = a.outer * a.inner, groups = e.groups_for(a.channels, 1);
  const LoopSplit sp = split_loops((a.channels + groups - 1) / groups, (n + 63) / 64, 8);
  const int64_t cspan = groups * sp.outer, jspan = 64 * sp.inner;
  for (int64_t c0 = 0; c0 < a.channels; c0 += cspan) {
    const int64_t c1 = std::min(a.channels, c0 + cspan);
    int64_t j0 = 0;
    do {
      const int64_t j1 = std::min(n, j0 + jspan);
      struct {
        uint32_t outer, channels, inner, j0, j1, accumulate, c0, c1;
      } p{u32(a.outer), u32(a.channels), u32(a.inner), u32(j0), u32(j1), j0 > 0, u32(c0), u32(c1)};
      e.dispatch("bias_grad", {rd(c.in[0]), j0 > 0 ? rw(c.out[0]) : wr(c.out[0])}, p, e.groups_for(c1 - c0, 1));
      j0 = j1;
    } while (j0 < n);
  }
}

}  // namespace

KILN_VULKAN_KERNEL("bias_add", {run_bias});
KILN_VULKAN_KERNEL("bias_grad", {run_bias});

}  // namespace kiln::vulkan
