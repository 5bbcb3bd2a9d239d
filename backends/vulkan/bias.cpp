// BiasAdd (elementwise, may run in place) and BiasGrad (a workgroup tree sum per channel).
#include <algorithm>
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
  const int64_t n = a.outer * a.inner, slice = 64 * kMaxLoop;  // short shader loops: long sums accumulate
  int64_t j0 = 0;
  do {
    const int64_t j1 = std::min(n, j0 + slice);
    struct {
      uint32_t outer, channels, inner, j0, j1, accumulate;
    } p{u32(a.outer), u32(a.channels), u32(a.inner), u32(j0), u32(j1), j0 > 0};
    e.dispatch("bias_grad", {rd(c.in[0]), j0 > 0 ? rw(c.out[0]) : wr(c.out[0])}, p, e.groups_for(a.channels, 1));
    j0 = j1;
  } while (j0 < n);
}

}  // namespace kiln::vulkan
