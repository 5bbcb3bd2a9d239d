// Convolutions as implicit GEMMs on the tiled kernel (kernels/vulkan/conv_*.comp). The filter gradient reduces
// over N*OH*OW, usually far longer than its output is wide, so it is split over K when a workspace is given.
// Reductions longer than kTileMaxK run as several dispatches (the loop budget, vulkan_ops.hpp).
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct ConvParams {
  uint32_t n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow, kchunk, kbegin, kend, accumulate;
};

ConvParams params(const ConvAttrs& a, int64_t kchunk, int64_t kbegin, int64_t kend, bool accumulate) {
  return {u32(a.n),        u32(a.c),        u32(a.h),     u32(a.w),     u32(a.k),     u32(a.r),
          u32(a.s),        u32(a.stride_h), u32(a.stride_w), u32(a.pad_h), u32(a.pad_w), u32(a.oh),
          u32(a.ow),       u32(std::max<int64_t>(kchunk, 1)), u32(kbegin), u32(kend), accumulate};
}

// Forward and backward-data: the reduction of length kd in ranges of at most kTileMaxK (the loop budget), one
// dispatch each; later ranges add to the output.
void run_tiled(Encoder& e, const char* kernel, const OpCall& call, const ConvAttrs& a, int64_t kd, int64_t rows,
               int64_t cols) {
  int64_t k0 = 0;
  do {
    const int64_t k1 = std::min(kd, k0 + kTileMaxK);
    e.dispatch(kernel, {rd(call.in[0]), rd(call.in[1]), k0 > 0 ? rw(call.out[0]) : wr(call.out[0])},
               params(a, k1 - k0, k0, k1, k0 > 0), ceil_div(cols, 64), ceil_div(rows, 64));
    k0 = k1;
  } while (k0 < kd);
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
      run_tiled(e, "conv_forward", call, a, a.c * a.r * a.s, m, a.k);
      return;
    }
    case OpKind::Conv2dBackwardData: {
      const int64_t m = a.n * a.h * a.w;
      if (m == 0 || a.c == 0) return;
      run_tiled(e, "conv_backward_data", call, a, a.k * a.r * a.s, m, a.c);
      return;
    }
    default: {
      const int64_t m = a.k, n = a.c * a.r * a.s, kd = a.n * a.oh * a.ow;
      if (m == 0 || n == 0) return;
      int64_t splits = filter_splits(a);
      const size_t ws_bytes = conv_workspace_bytes(a);
      if (call.workspace.bytes < ws_bytes || ws_bytes > e.limits().max_range) splits = 1;  // no scratch: one pass
      if (splits == 1) {
        run_tiled(e, "conv_backward_filter", call, a, kd, m, n);
        return;
      }
      // Each pass runs up to `splits` ranges of `chunk` (at most kTileMaxK) over gl_WorkGroupID.z into the
      // workspace, then sums them into dw; later passes add to dw.
      const int64_t chunk = std::min(round_up((kd + splits - 1) / splits, 16), kTileMaxK);
      BufferView ws = call.workspace;
      for (int64_t k0 = 0; k0 < kd; k0 += splits * chunk) {
        const int64_t k1 = std::min(kd, k0 + splits * chunk), z = (k1 - k0 + chunk - 1) / chunk;
        ws.bytes = static_cast<size_t>(z * m * n) * sizeof(float);
        e.dispatch("conv_backward_filter", {rd(call.in[0]), rd(call.in[1]), wr(ws)}, params(a, chunk, k0, k1, false),
                   ceil_div(n, 64), ceil_div(m, 64), u32(z));
        for_ranges(e, m * n, 256, z, [&](int64_t i0, int64_t i1, uint32_t groups) {
          struct {
            uint32_t i0, i1, count, splits, accumulate;
          } q{u32(i0), u32(i1), u32(m * n), u32(z), k0 > 0};
          e.dispatch("splitk_reduce", {rd(ws), k0 > 0 ? rw(call.out[0]) : wr(call.out[0])}, q, groups);
        });
      }
    }
  }
}

}  // namespace kiln::vulkan
