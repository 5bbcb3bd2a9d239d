// Max and average pooling, forward (one invocation per output) and backward (one per input element,
// gathering from the windows that cover it: deterministic, no atomics).
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

struct PoolParams {
  uint32_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, mode, i0, i1;
};

// Counted loop iterations per item of the pooling kernels (an output forward, an input backward): the window
// walk (rows, and columns in each), and backward the outputs covering the input (max: each window walked again).
int64_t pool_item_cost(OpKind kind, const PoolAttrs& a) {
  const int64_t wh = std::min(a.kh, a.h), ww = std::min(a.kw, a.w);
  const int64_t window = wh * (ww + 1);
  const int64_t cy = std::min((a.kh + a.stride_h - 1) / std::max<int64_t>(a.stride_h, 1), a.oh);
  const int64_t cx = std::min((a.kw + a.stride_w - 1) / std::max<int64_t>(a.stride_w, 1), a.ow);
  const int64_t cover = cy * (cx + 1);
  if (kind == OpKind::MaxPoolForward || kind == OpKind::AvgPoolForward) return window;
  if (kind == OpKind::AvgPoolBackward) return cover;
  return cover + cy * cx * window;
}

void run_pool(Encoder& e, const OpCall& call) {
  const auto& a = std::get<PoolAttrs>(call.attrs);
  const bool max = call.kind == OpKind::MaxPoolForward || call.kind == OpKind::MaxPoolBackward;
  PoolParams p{u32(a.n),
               u32(a.c),
               u32(a.h),
               u32(a.w),
               u32(a.kh),
               u32(a.kw),
               u32(a.stride_h),
               u32(a.stride_w),
               u32(a.pad_h),
               u32(a.pad_w),
               u32(a.oh),
               u32(a.ow),
               max ? 0u : 1u,
               0,
               0};
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

Support pool_supports(OpKind kind, const OpAttrs& attrs, const DeviceLimits&) {
  const auto& a = std::get<PoolAttrs>(attrs);
  if (Support s = window_fits(a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.kh, a.kw); !s.yes) return s;
  return row_fits(pool_item_cost(kind, a), 0,
                  "a " + std::to_string(a.kh) + "x" + std::to_string(a.kw) + " window (stride " +
                      std::to_string(a.stride_h) + "x" + std::to_string(a.stride_w) + ")");
}

}  // namespace

KILN_VULKAN_KERNEL("max_pool_forward", {run_pool, pool_supports});
KILN_VULKAN_KERNEL("max_pool_backward", {run_pool, pool_supports});
KILN_VULKAN_KERNEL("avg_pool_forward", {run_pool, pool_supports});
KILN_VULKAN_KERNEL("avg_pool_backward", {run_pool, pool_supports});

}  // namespace kiln::vulkan
