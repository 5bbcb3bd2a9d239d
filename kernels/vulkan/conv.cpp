// Convolutions as implicit GEMMs on the tiled kernel (kernels/vulkan/conv_*.comp). The filter gradient reduces
// over N*OH*OW, usually far longer than its output is wide, so it is split over K when a workspace is given.
// On llvmpipe, given their workspace and where c*r*s and oh*ow are multiples of 4, all three run on gemm_lvp
// (kernels/vulkan/gemm_lvp.glsl) instead: the patch matrix of a chunk of images is written out (conv_im2col), or
// folded back onto dx (conv_col2im), around ordinary matrix products.
// Reductions longer than kTileMaxK run as several dispatches (the loop budget, kernel_support.hpp).
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

struct ConvParams {
  uint32_t n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow, kchunk, kbegin, kend, accumulate;
};

ConvParams params(const ConvAttrs& a, int64_t kchunk, int64_t kbegin, int64_t kend, bool accumulate) {
  return {u32(a.n),        u32(a.c),
          u32(a.h),        u32(a.w),
          u32(a.k),        u32(a.r),
          u32(a.s),        u32(a.stride_h),
          u32(a.stride_w), u32(a.pad_h),
          u32(a.pad_w),    u32(a.oh),
          u32(a.ow),       u32(std::max<int64_t>(kchunk, 1)),
          u32(kbegin),     u32(kend),
          accumulate};
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

// The tiled filter gradient's split-K partial sums.
size_t split_bytes(const ConvAttrs& a) {
  const int64_t splits = filter_splits(a);
  return splits > 1 ? static_cast<size_t>(splits * a.k * a.c * a.r * a.s) * sizeof(float) : 0;
}

// llvmpipe's forward pass: the patch matrix (c*r*s, oh*ow) of a chunk of images (conv_im2col) in the workspace,
// multiplied with the filters (k, c*r*s) by gemm_lvp (kernels/vulkan/gemm_lvp.glsl), one product per image with the
// filters shared. The workspace holds at most kIm2colBytes of patches (at least one image).
constexpr int64_t kIm2colBytes = 16 << 20;

bool im2col_fits(const ConvAttrs& a, const DeviceLimits& l) {
  const int64_t crs = a.c * a.r * a.s, ohw = a.oh * a.ow;
  return l.llvmpipe_gemm && crs % 4 == 0 && ohw % 4 == 0 && crs > 0 && ohw > 0 && crs <= l.max_groups[1] &&
         ohw < (int64_t(1) << 22) && (ohw + 63) / 64 <= l.max_groups[0] &&
         crs * ohw * int64_t(sizeof(float)) <= int64_t(l.max_range);
}

int64_t im2col_images(const ConvAttrs& a) {
  const int64_t per_image = a.c * a.r * a.s * a.oh * a.ow * int64_t(sizeof(float));
  return std::clamp<int64_t>(kIm2colBytes / per_image, 1, std::max<int64_t>(a.n, 1));
}

BufferView sub(BufferView v, int64_t first, int64_t count) {
  v.offset += static_cast<size_t>(first) * sizeof(float);
  v.bytes = static_cast<size_t>(count) * sizeof(float);
  return v;
}

struct ImageParams {
  uint32_t c, h, w, r, s, sh, sw, ph, pw, oh, ow, n0;
  float inv;  // 1/ow (im2col), 1/w (col2im)
};
ImageParams image_params(const ConvAttrs& a, int64_t n0, int64_t width) {
  return {u32(a.c),     u32(a.h),     u32(a.w),  u32(a.r),  u32(a.s), u32(a.stride_h),   u32(a.stride_w),
          u32(a.pad_h), u32(a.pad_w), u32(a.oh), u32(a.ow), u32(n0),  1.f / float(width)};
}

// The patches of images [n0, n0 + nb) into cols (nb, c*r*s, oh*ow).
void im2col(Encoder& e, const OpCall& call, const ConvAttrs& a, int64_t n0, int64_t nb, const BufferView& cols) {
  e.dispatch("conv_im2col", {rd(call.in[0]), wr(cols)}, image_params(a, n0, a.ow), ceil_div(a.oh * a.ow, 64),
             u32(a.c * a.r * a.s), u32(nb));
}

size_t cols_bytes(const ConvAttrs& a) {
  return static_cast<size_t>(im2col_images(a) * a.c * a.r * a.s * a.oh * a.ow) * sizeof(float);
}
// The filter gradient's partial sums, one (k, c*r*s) per image of a chunk, after the patches.
size_t partials_bytes(const ConvAttrs& a) {
  return static_cast<size_t>(im2col_images(a) * a.k * a.c * a.r * a.s) * sizeof(float);
}

bool col2im_fits(const ConvAttrs& a, const DeviceLimits& l) {
  const int64_t hw = a.h * a.w;
  return a.stride_h == 1 && a.stride_w == 1 && hw > 0 && hw < (int64_t(1) << 22) && (hw + 63) / 64 <= l.max_groups[0] &&
         a.c <= l.max_groups[1] && a.r * (a.s + 1) <= kLoopBudget;
}

// Each returns false (nothing recorded) when the device, the shape, the views or the workspace do not allow it.
// Forward: y_n (k, oh*ow) = w (k, c*r*s) * cols_n.
bool run_forward_im2col(Encoder& e, const OpCall& call, const ConvAttrs& a) {
  if (!im2col_fits(a, e.limits()) || call.workspace.bytes < cols_bytes(a)) return false;
  const int64_t crs = a.c * a.r * a.s, ohw = a.oh * a.ow, chunk = im2col_images(a);
  LvpGemm g;
  g.m = a.k, g.n = ohw, g.k = crs, g.sa = 0, g.sb = crs * ohw, g.sy = a.k * ohw;
  if (!lvp_gemm_ok(e, g, call.in[1], call.workspace)) return false;
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    const BufferView cols = sub(call.workspace, 0, nb * crs * ohw);
    im2col(e, call, a, n0, nb, cols);
    g.batch = nb;
    lvp_gemm(e, g, call.in[1], cols, sub(call.out[0], n0 * a.k * ohw, nb * a.k * ohw));
  }
  return true;
}

// Backward data: cols_n (c*r*s, oh*ow) = w^T * dy_n, then folded onto dx (conv_col2im). in: dy, w; out: dx.
bool run_backward_data_col2im(Encoder& e, const OpCall& call, const ConvAttrs& a) {
  if (!im2col_fits(a, e.limits()) || !col2im_fits(a, e.limits()) || call.workspace.bytes < cols_bytes(a)) return false;
  const int64_t crs = a.c * a.r * a.s, ohw = a.oh * a.ow, chunk = im2col_images(a);
  LvpGemm g;
  g.m = crs, g.n = ohw, g.k = a.k, g.trans_a = true, g.sa = 0, g.sb = a.k * ohw, g.sy = crs * ohw;
  if (!lvp_gemm_ok(e, g, call.in[1], call.in[0])) return false;
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    const BufferView cols = sub(call.workspace, 0, nb * crs * ohw);
    g.batch = nb;
    lvp_gemm(e, g, call.in[1], sub(call.in[0], n0 * a.k * ohw, nb * a.k * ohw), cols);
    e.dispatch("conv_col2im", {rd(cols), wr(call.out[0])}, image_params(a, n0, a.w), ceil_div(a.h * a.w, 64), u32(a.c),
               u32(nb));
  }
  return true;
}

// Backward filter: partial_n (k, c*r*s) = dy_n * cols_n^T for the images of a chunk, summed in image order into
// dw (splitk_reduce; later chunks add). in: x, dy; out: dw.
bool run_backward_filter_im2col(Encoder& e, const OpCall& call, const ConvAttrs& a) {
  const size_t cb = cols_bytes(a);
  if (!im2col_fits(a, e.limits()) || call.workspace.bytes < cb + partials_bytes(a)) return false;
  const int64_t crs = a.c * a.r * a.s, ohw = a.oh * a.ow, chunk = im2col_images(a);
  LvpGemm g;
  g.m = a.k, g.n = crs, g.k = ohw, g.trans_b = true, g.sa = a.k * ohw, g.sb = crs * ohw, g.sy = a.k * crs;
  if (!lvp_gemm_ok(e, g, call.in[1], call.workspace)) return false;
  const int64_t count = a.k * crs;
  for (int64_t n0 = 0; n0 < a.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, a.n - n0);
    const BufferView cols = sub(call.workspace, 0, nb * crs * ohw);
    const BufferView parts = sub(call.workspace, int64_t(cb / sizeof(float)), nb * count);
    im2col(e, call, a, n0, nb, cols);
    g.batch = nb;
    lvp_gemm(e, g, sub(call.in[1], n0 * a.k * ohw, nb * a.k * ohw), cols, parts);
    for_ranges(e, count, 256, nb, [&](int64_t i0, int64_t i1, uint32_t groups) {
      struct {
        uint32_t i0, i1, count, splits, accumulate;
      } q{u32(i0), u32(i1), u32(count), u32(nb), n0 > 0};
      e.dispatch("splitk_reduce", {rd(parts), n0 > 0 ? rw(call.out[0]) : wr(call.out[0])}, q, groups);
    });
  }
  return true;
}

size_t conv_workspace_bytes(const OpCall& call, const DeviceLimits& limits) {
  const auto& a = std::get<ConvAttrs>(call.attrs);
  const bool lvp = im2col_fits(a, limits);
  switch (call.kind) {
    case OpKind::Conv2dForward:
      return lvp ? cols_bytes(a) : 0;
    case OpKind::Conv2dBackwardData:
      return lvp && col2im_fits(a, limits) ? cols_bytes(a) : 0;
    default:
      return std::max(split_bytes(a), lvp ? cols_bytes(a) + partials_bytes(a) : 0);
  }
}

void run_conv(Encoder& e, const OpCall& call) {
  const auto& a = std::get<ConvAttrs>(call.attrs);
  switch (call.kind) {
    case OpKind::Conv2dForward: {
      const int64_t m = a.n * a.oh * a.ow;
      if (m == 0 || a.k == 0) return;
      if (run_forward_im2col(e, call, a)) return;
      run_tiled(e, "conv_forward", call, a, a.c * a.r * a.s, m, a.k);
      return;
    }
    case OpKind::Conv2dBackwardData: {
      const int64_t m = a.n * a.h * a.w;
      if (m == 0 || a.c == 0) return;
      if (run_backward_data_col2im(e, call, a)) return;
      run_tiled(e, "conv_backward_data", call, a, a.k * a.r * a.s, m, a.c);
      return;
    }
    default: {
      const int64_t m = a.k, n = a.c * a.r * a.s, kd = a.n * a.oh * a.ow;
      if (m == 0 || n == 0) return;
      if (run_backward_filter_im2col(e, call, a)) return;
      int64_t splits = filter_splits(a);
      const size_t ws_bytes = split_bytes(a);
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

Support conv_supports(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits) {
  const auto& a = std::get<ConvAttrs>(attrs);
  if (Support s = window_fits(a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.r, a.s); !s.yes) return s;
  if (kind == OpKind::Conv2dForward) return tiles_fit(a.n * a.oh * a.ow, a.k, limits);
  if (kind == OpKind::Conv2dBackwardData) return tiles_fit(a.n * a.h * a.w, a.c, limits);
  return tiles_fit(a.k, a.c * a.r * a.s, limits);
}

}  // namespace

KILN_VULKAN_KERNEL("conv2d_forward", {run_conv, conv_supports, conv_workspace_bytes});
KILN_VULKAN_KERNEL("conv2d_backward_data", {run_conv, conv_supports, conv_workspace_bytes});
KILN_VULKAN_KERNEL("conv2d_backward_filter", {run_conv, conv_supports, conv_workspace_bytes});

}  // namespace kiln::vulkan
