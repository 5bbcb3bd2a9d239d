// Convolutions as implicit GEMMs on the tiled kernel (kernels/vulkan/conv_*.comp). The filter gradient reduces
// over N*OH*OW, usually far longer than its output is wide, so it is split over K when a workspace is given.
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct ConvParams {
  uint32_t n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow, kchunk;
};

ConvParams params(const ConvAttrs& a, int64_t kchunk) {
  return {u32(a.n),        u32(a.c),        u32(a.h),     u32(a.w),     u32(a.k),     u32(a.r),
          u32(a.s),        u32(a.stride_h), u32(a.stride_w), u32(a.pad_h), u32(a.pad_w), u32(a.oh),
          u32(a.ow),       u32(std::max<int64_t>(kchunk, 1))};
}

// How many K splits the filter gradient uses: enough workgroups to fill the device, >= 256 of K each.
int64_t filter_splits(const ConvAttrs& a) {
  const int64_t m = a.k, n = a.c * a.r * a.s, kd = a.n * a.oh * a.ow;
  const int64_t tiles = ((m + 63) / 64) * ((n + 63) / 64);
  if (tiles == 0) return 1;
  return std::clamp<int64_t>(std::min<int64_t>((64 + tiles - 1) / tiles, kd / 256), 1, 64);
}

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

}  // namespace

size_t conv_workspace_bytes(const ConvAttrs& a) {
  const int64_t splits = filter_splits(a);
  return splits > 1 ? static_cast<size_t>(splits * a.k * a.c * a.r * a.s) * sizeof(float) : 0;
}

void run_conv(Encoder& e, const OpCall& call) {
  const auto& a = std::get<ConvAttrs>(call.attrs);
  switch (call.kind) {
    case OpKind::Conv2dForward: {
      const int64_t m = a.n * a.oh * a.ow;
      if (m == 0 || a.k == 0) return;
      e.dispatch("conv_forward", {rd(call.in[0]), rd(call.in[1]), wr(call.out[0])}, params(a, a.c * a.r * a.s),
                 ceil_div(a.k, 64), ceil_div(m, 64));
      return;
    }
    case OpKind::Conv2dBackwardData: {
      const int64_t m = a.n * a.h * a.w;
      if (m == 0 || a.c == 0) return;
      e.dispatch("conv_backward_data", {rd(call.in[0]), rd(call.in[1]), wr(call.out[0])},
                 params(a, a.k * a.r * a.s), ceil_div(a.c, 64), ceil_div(m, 64));
      return;
    }
    default: {
      const int64_t m = a.k, n = a.c * a.r * a.s, kd = a.n * a.oh * a.ow;
      if (m == 0 || n == 0) return;
      int64_t splits = filter_splits(a);
      const size_t ws_bytes = conv_workspace_bytes(a);
      if (call.workspace.bytes < ws_bytes || ws_bytes > e.limits().max_range) splits = 1;  // no scratch: one pass
      const int64_t chunk = splits > 1 ? round_up((kd + splits - 1) / splits, 16) : kd;
      splits = splits > 1 ? (kd + chunk - 1) / chunk : 1;
      if (splits == 1) {
        e.dispatch("conv_backward_filter", {rd(call.in[0]), rd(call.in[1]), wr(call.out[0])}, params(a, chunk),
                   ceil_div(n, 64), ceil_div(m, 64));
        return;
      }
      BufferView ws = call.workspace;
      ws.bytes = static_cast<size_t>(splits * m * n) * sizeof(float);
      e.dispatch("conv_backward_filter", {rd(call.in[0]), rd(call.in[1]), wr(ws)}, params(a, chunk),
                 ceil_div(n, 64), ceil_div(m, 64), u32(splits));
      struct {
        uint32_t count, splits;
      } rp{u32(m * n), u32(splits)};
      e.dispatch("splitk_reduce", {rd(ws), wr(call.out[0])}, rp, e.groups_for(m * n));
    }
  }
}

}  // namespace kiln::vulkan
