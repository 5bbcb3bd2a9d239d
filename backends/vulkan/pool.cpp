// Max and average pooling, forward (one invocation per output) and backward (one per input element,
// gathering from the windows that cover it: deterministic, no atomics).
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct PoolParams {
  uint32_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, mode, i0, i1;
};

}  // namespace

void run_pool(Encoder& e, const OpCall& call) {
  const auto& a = std::get<PoolAttrs>(call.attrs);
  const bool max = call.kind == OpKind::MaxPoolForward || call.kind == OpKind::MaxPoolBackward;
  PoolParams p{u32(a.n),     u32(a.c),     u32(a.h),  u32(a.w),  u32(a.kh), u32(a.kw), u32(a.stride_h), u32(a.stride_w),
               u32(a.pad_h), u32(a.pad_w), u32(a.oh), u32(a.ow), max ? 0u : 1u, 0, 0};
  const bool fwd = call.kind == OpKind::MaxPoolForward || call.kind == OpKind::AvgPoolForward;
  const int64_t items = fwd ? a.n * a.c * a.oh * a.ow : a.n * a.c * a.h * a.w;
  // Ranges of items, one dispatch each, so each invocation's window loops stay within the loop budget.
  for_ranges(e, items, 256, pool_item_cost(call.kind, a), [&](int64_t i0, int64_t i1, uint32_t groups) {
    p.i0 = u32(i0);
    p.i1 = u32(i1);
    if (fwd)
      e.dispatch("pool_forward", {rd(call.in[0]), wr(call.out[0])}, p, groups);
    else if (max)
      e.dispatch("pool_max_backward", {rd(call.in[0]), rd(call.in[1]), rd(call.in[2]), wr(call.out[0])}, p, groups);
    else
      e.dispatch("pool_avg_backward", {rd(call.in[0]), wr(call.out[0])}, p, groups);
  });
}

}  // namespace kiln::vulkan
