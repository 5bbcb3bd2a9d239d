// Max and average pooling, forward (one invocation per output) and backward (one per input element,
// gathering from the windows that cover it: deterministic, no atomics).
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct PoolParams {
  uint32_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, mode;
};

}  // namespace

void run_pool(Encoder& e, const OpCall& call) {
  const auto& a = std::get<PoolAttrs>(call.attrs);
  const bool max = call.kind == OpKind::MaxPoolForward || call.kind == OpKind::MaxPoolBackward;
  const PoolParams p{u32(a.n),        u32(a.c),        u32(a.h),     u32(a.w),     u32(a.kh), u32(a.kw), u32(a.stride_h),
                     u32(a.stride_w), u32(a.pad_h),    u32(a.pad_w), u32(a.oh),    u32(a.ow), max ? 0u : 1u};
  const int64_t outputs = a.n * a.c * a.oh * a.ow, inputs = a.n * a.c * a.h * a.w;
  switch (call.kind) {
    case OpKind::MaxPoolForward:
    case OpKind::AvgPoolForward:
      e.dispatch("pool_forward", {rd(call.in[0]), wr(call.out[0])}, p, e.groups_for(outputs));
      return;
    case OpKind::MaxPoolBackward:
      e.dispatch("pool_max_backward", {rd(call.in[0]), rd(call.in[1]), rd(call.in[2]), wr(call.out[0])}, p,
                 e.groups_for(inputs));
      return;
    default:
      e.dispatch("pool_avg_backward", {rd(call.in[0]), wr(call.out[0])}, p, e.groups_for(inputs));
  }
}

}  // namespace kiln::vulkan
