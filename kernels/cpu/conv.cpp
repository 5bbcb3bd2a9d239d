// 2-D convolution as im2col + sgemm per image. Images are claimed one at a time by the pool's threads (each
// thread owns a column buffer in the workspace, by slot); with fewer images than threads, the images run in
// turn and the GEMM is split.
// A 1x1, stride-1, unpadded convolution is a plain GEMM on the image (no column buffer). With stride 1 and "same"
// rows (ow == w), each tap's im2col rows are one shifted copy of the plane (im2col_shifted, col2im_shifted).
#include "conv.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "bf16_io_conv.hpp"
#include "conv_dnnl.hpp"
#include "cpu_kernel.hpp"
#include "gemm.hpp"
#include "kiln/error.hpp"
#include "pool.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

int64_t crs(const ConvAttrs& a) { return a.c * a.r * a.s; }
int64_t ohw(const ConvAttrs& a) { return a.oh * a.ow; }
bool is_pointwise(const ConvAttrs& a) {
  return a.r == 1 && a.s == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_h == 0 && a.pad_w == 0 && a.oh == a.h &&
         a.ow == a.w;
}
bool images_in_parallel(const ConvAttrs& a, int threads) { return threads > 1 && a.n >= threads; }

int64_t ceil_div(int64_t p, int64_t q) { return p <= 0 ? 0 : (p + q - 1) / q; }

// The output columns [lo, hi) whose input column ox*sw - pw + s lies inside the image.
void valid_cols(const ConvAttrs& a, int64_t s, int64_t& lo, int64_t& hi) {
  lo = std::min(ceil_div(a.pad_w - s, a.stride_w), a.ow);
  hi = std::max(lo, std::min(ceil_div(a.w + a.pad_w - s, a.stride_w), a.ow));
}

// Stride 1 with output rows as long as the input's (ow == w: "same" padding): tap (r, s) of a channel is the input
// plane shifted by delta = (r - pad_h) * w + (s - pad_w), so the rows that fall inside the image are one contiguous
// run of the plane. The shifted layouts hold for this case only; the general loops below cover every other.
bool shifted_layout(const ConvAttrs& a) { return a.stride_h == 1 && a.stride_w == 1 && a.ow == a.w && a.pad_w >= 0; }

struct TapRun {
  int64_t ylo, yhi;  // output rows whose input row lies inside the image
  int64_t jb, je;    // the run [jb, je) of the tap's column row with plane index j + delta inside the plane
  int64_t delta;
  int64_t lo, hi;  // output columns inside the image (valid_cols)
};

TapRun tap_run(const ConvAttrs& a, int64_t r, int64_t s) {
  TapRun t;
  t.ylo = std::clamp<int64_t>(a.pad_h - r, 0, a.oh);
  t.yhi = std::clamp<int64_t>(a.h + a.pad_h - r, t.ylo, a.oh);
  t.delta = (r - a.pad_h) * a.w + (s - a.pad_w);
  t.jb = std::max(t.ylo * a.ow, -t.delta);
  t.je = std::max(t.jb, std::min(t.yhi * a.ow, a.h * a.w - t.delta));
  valid_cols(a, s, t.lo, t.hi);
  return t;
}

// x: (c, h, w) of one image -> col: (c*r*s, oh*ow), stride 1 and ow == w: one copy per tap, then the rows and
// columns outside the image set to zero (the entries skipped at the run's ends are such columns).
void im2col_shifted(const ConvAttrs& a, const float* x, float* col) {
  const int64_t cols = ohw(a), plane = a.h * a.w;
  for (int64_t r = 0; r < a.r; ++r)
    for (int64_t s = 0; s < a.s; ++s) {
      const TapRun t = tap_run(a, r, s);
      for (int64_t c = 0; c < a.c; ++c) {
        float* dst = col + ((c * a.r + r) * a.s + s) * cols;
        std::fill(dst, dst + t.jb, 0.f);
        if (t.je > t.jb)
          std::memcpy(dst + t.jb, x + c * plane + t.jb + t.delta, static_cast<size_t>(t.je - t.jb) * sizeof(float));
        std::fill(dst + t.je, dst + cols, 0.f);
        if (t.lo > 0 || t.hi < a.ow)
          for (int64_t oy = t.ylo; oy < t.yhi; ++oy) {
            float* d = dst + oy * a.ow;
            for (int64_t ox = 0; ox < t.lo; ++ox) d[ox] = 0.f;
            for (int64_t ox = t.hi; ox < a.ow; ++ox) d[ox] = 0.f;
          }
      }
    }
}

// x: (c, h, w) of one image -> col: (c*r*s, oh*ow).
void im2col(const ConvAttrs& a, const float* x, float* col) {
  if (shifted_layout(a)) return im2col_shifted(a, x, col);
  const int64_t cols = ohw(a);
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t r = 0; r < a.r; ++r)
      for (int64_t s = 0; s < a.s; ++s) {
        float* dst = col + ((c * a.r + r) * a.s + s) * cols;
        int64_t lo, hi;
        valid_cols(a, s, lo, hi);
        for (int64_t oy = 0; oy < a.oh; ++oy) {
          float* d = dst + oy * a.ow;
          const int64_t iy = oy * a.stride_h - a.pad_h + r;
          if (iy < 0 || iy >= a.h) {
            std::fill(d, d + a.ow, 0.f);
            continue;
          }
          const float* row = x + (c * a.h + iy) * a.w;
          const int64_t off = s - a.pad_w;  // row[ox * sw + off] is output column ox
          std::fill(d, d + lo, 0.f);
          if (a.stride_w == 1)
            std::memcpy(d + lo, row + lo + off, static_cast<size_t>(hi - lo) * sizeof(float));
          else
            for (int64_t ox = lo; ox < hi; ++ox) d[ox] = row[ox * a.stride_w + off];
          std::fill(d + hi, d + a.ow, 0.f);
        }
      }
}

// col2im for stride 1 and ow == w: the entries of columns outside the image are zeroed in col (a scratch buffer),
// then each tap adds one contiguous run into the shifted plane.
void col2im_shifted(const ConvAttrs& a, float* col, float* dx) {
  const int64_t cols = ohw(a), plane = a.h * a.w;
  std::fill(dx, dx + a.c * plane, 0.f);
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t r = 0; r < a.r; ++r)
      for (int64_t s = 0; s < a.s; ++s) {
        const TapRun t = tap_run(a, r, s);
        float* src = col + ((c * a.r + r) * a.s + s) * cols;
        if (t.lo > 0 || t.hi < a.ow)
          for (int64_t oy = t.ylo; oy < t.yhi; ++oy) {
            float* d = src + oy * a.ow;
            for (int64_t ox = 0; ox < t.lo; ++ox) d[ox] = 0.f;
            for (int64_t ox = t.hi; ox < a.ow; ++ox) d[ox] = 0.f;
          }
        float* dst = dx + c * plane;
#pragma omp simd
        for (int64_t j = t.jb; j < t.je; ++j) dst[j + t.delta] += src[j];
      }
}

// dx: (c, h, w) of one image = the sum of col's entries over the taps that read each pixel. col is scratch.
void col2im(const ConvAttrs& a, float* col, float* dx) {
  if (shifted_layout(a)) return col2im_shifted(a, col, dx);
  const int64_t cols = ohw(a);
  std::fill(dx, dx + a.c * a.h * a.w, 0.f);
  for (int64_t c = 0; c < a.c; ++c)
    for (int64_t r = 0; r < a.r; ++r)
      for (int64_t s = 0; s < a.s; ++s) {
        const float* src = col + ((c * a.r + r) * a.s + s) * cols;
        int64_t lo, hi;
        valid_cols(a, s, lo, hi);
        for (int64_t oy = 0; oy < a.oh; ++oy) {
          const int64_t iy = oy * a.stride_h - a.pad_h + r;
          if (iy < 0 || iy >= a.h) continue;
          float* row = dx + (c * a.h + iy) * a.w;
          const int64_t off = s - a.pad_w;
          const float* sp = src + oy * a.ow;
          if (a.stride_w == 1)
            for (int64_t ox = lo; ox < hi; ++ox) row[ox + off] += sp[ox];
          else
            for (int64_t ox = lo; ox < hi; ++ox) row[ox * a.stride_w + off] += sp[ox];
        }
      }
}

// Backward-filter partial sums: images are summed in fixed groups, so the result depends on the thread
// count only, never on which thread ran which group.
int64_t filter_groups(const ConvAttrs& a, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(a.n, 2 * static_cast<int64_t>(threads)));
}

// Workspace in floats for `threads` threads: oneDNN's where it takes the call, else a column buffer per thread and
// backward filter's partial sums. Asked with the same `winograd` as the kernels.
size_t conv_workspace_floats(OpKind k, const ConvAttrs& a, int threads, bool winograd) {
  size_t dnnl_floats = 0;
  if (dnnl_conv_workspace(k, a, threads, winograd, dnnl_floats)) return dnnl_floats;
  const size_t col = is_pointwise(a) ? 0 : static_cast<size_t>(crs(a) * ohw(a));
  const size_t t = static_cast<size_t>(std::max(threads, 1));
  if (k == OpKind::Conv2dBackwardFilter)
    return t * col + static_cast<size_t>(filter_groups(a, threads) - 1) * static_cast<size_t>(a.k * crs(a));
  return t * col;
}

}  // namespace

// With an epilogue, the bias is written into y(n) first and the GEMM accumulates onto it (beta = 1, which also
// spares OpenBLAS its pass zeroing C), then the ReLU and the max pool read y(n) while it is still in cache.
namespace {

void prefill_bias(const ConvAttrs& a, const ConvEpilogue* ep, float* yn) {
  const int64_t P = ohw(a);
  for (int64_t k = 0; k < a.k; ++k) std::fill(yn + k * P, yn + (k + 1) * P, ep->bias[k]);
}

}  // namespace

void conv_epilogue(const ConvAttrs& a, const ConvEpilogue& ep, bool add_bias, float* y, int64_t n0, int64_t n1) {
  const int64_t K = a.k, P = ohw(a);
  for (int64_t n = n0; n < n1; ++n) {
    float* yn = y + n * K * P;
    if (add_bias && ep.bias)
      for (int64_t k = 0; k < K; ++k) {
        const float b = ep.bias[k];
        float* row = yn + k * P;
#pragma omp simd
        for (int64_t i = 0; i < P; ++i) row[i] += b;
      }
    if (ep.relu_out) {
      float* r = ep.relu_out + n * K * P;  // may be yn
#pragma omp simd
      for (int64_t i = 0; i < K * P; ++i) r[i] = yn[i] < 0.f ? 0.f : yn[i];  // NaN passes through, as ActivationForward
    }
  }
  if (ep.relu_out && ep.pool && ep.pool_out) max_pool_planes(*ep.pool, ep.relu_out, ep.pool_out, n0 * K, n1 * K);
}

void conv_epilogue_bf16(const ConvAttrs& a, const ConvEpilogueBf16& ep, uint16_t* y, int64_t n0, int64_t n1) {
  using bf16io::load;
  const int64_t K = a.k, P = ohw(a);
  for (int64_t n = n0; n < n1; ++n) {
    uint16_t* yn = y + n * K * P;
    for (int64_t k = 0; k < K; ++k) {
      uint16_t* row = yn + k * P;
      if (ep.bias) {
        const float b = ep.bias[k];
        bf16io::store_all(row, P, [&](int64_t i) { return load(row[i]) + b; });
      }
      if (ep.relu_out) {
        uint16_t* r = ep.relu_out + n * K * P + k * P;  // may be row
        // ReLU on the bf16 bits, as ActivationForward's v < 0 ? 0 : v: a number below zero (sign set, magnitude
        // neither 0 nor NaN) becomes +0; -0 and NaN pass.
#pragma omp simd
        for (int64_t i = 0; i < P; ++i) {
          const uint16_t h = row[i], mag = h & 0x7fffu;
          r[i] = (h & 0x8000u) && mag != 0 && mag <= 0x7f80u ? uint16_t{0} : h;
        }
      }
    }
  }
  if (ep.relu_out && ep.pool && ep.pool_out) max_pool_planes_bf16(*ep.pool, ep.relu_out, ep.pool_out, n0 * K, n1 * K);
}

// y(n) (k, oh*ow) = w (k, c*r*s) * col(n) [+ bias, then ReLU, then max pool].
void conv2d_forward(const ConvAttrs& a, const float* x, const float* w, float* y, float* ws, ThreadPool& pool,
                    bool winograd, const ConvEpilogue* ep) {
  const int64_t K = a.k, CRS = crs(a), P = ohw(a), img = a.c * a.h * a.w;
  const bool pw = is_pointwise(a);
  const bool bias = ep && ep->bias;
  const float beta = bias ? 1.f : 0.f;
  if (dnnl_conv(OpKind::Conv2dForward, a, x, w, y, ws, pool, winograd, ep)) return;  // the epilogue included
  // A pointwise conv has no im2col buffer (ws may be null): no offset is applied to it, not even an unused one.
  const size_t col_floats = pw ? 0 : static_cast<size_t>(CRS * P);
  if (images_in_parallel(a, pool.size())) {
    pool.run(a.n, [&](int64_t n, int slot) {
      float* col = ws + static_cast<size_t>(slot) * col_floats;
      const float* src = x + n * img;
      float* yn = y + n * K * P;
      if (!pw) im2col(a, src, col);
      if (bias) prefill_bias(a, ep, yn);
      sgemm_1t(false, false, K, P, CRS, 1.f, w, CRS, pw ? src : col, P, beta, yn, P);
      if (ep) conv_epilogue(a, *ep, false, y, n, n + 1);
    });
    return;
  }
  for (int64_t n = 0; n < a.n; ++n) {
    const float* src = x + n * img;
    float* yn = y + n * K * P;
    if (!pw) im2col(a, src, ws);
    if (bias) prefill_bias(a, ep, yn);
    gemm(GemmAttrs{K, P, CRS, false, false, 1.f, beta}, w, pw ? src : ws, yn, pool);
    if (ep) conv_epilogue(a, *ep, false, y, n, n + 1);
  }
}

// dcol(n) (c*r*s, oh*ow) = w^T * dy(n); dx(n) = col2im(dcol(n))
namespace {

// The prologue over the whole batch, before a path that reads dy all at once.
void run_prologue(const ConvAttrs& a, const ConvPrologue* pro, ThreadPool& pool) {
  if (pro)
    parallel_ranges(pool, a.n, std::min<int64_t>(a.n, 4 * pool.size()), [&](int64_t b, int64_t e) { (*pro)(b, e); });
}

}  // namespace

void conv2d_backward_data(const ConvAttrs& a, const float* dy, const float* w, float* dx, float* ws, ThreadPool& pool,
                          bool winograd, const ConvPrologue* pro) {
  if (dnnl_conv(OpKind::Conv2dBackwardData, a, dy, w, dx, ws, pool, winograd, nullptr, pro)) return;
  run_prologue(a, pro, pool);
  const int64_t K = a.k, CRS = crs(a), P = ohw(a), img = a.c * a.h * a.w;
  const bool pw = is_pointwise(a);
  // A pointwise conv has no im2col buffer (ws may be null): no offset is applied to it, not even an unused one.
  const size_t col_floats = pw ? 0 : static_cast<size_t>(CRS * P);
  if (images_in_parallel(a, pool.size())) {
    pool.run(a.n, [&](int64_t n, int slot) {
      float* col = ws + static_cast<size_t>(slot) * col_floats;
      float* dst = dx + n * img;
      sgemm_1t(true, false, CRS, P, K, 1.f, w, CRS, dy + n * K * P, P, 0.f, pw ? dst : col, P);
      if (!pw) col2im(a, col, dst);
    });
    return;
  }
  for (int64_t n = 0; n < a.n; ++n) {
    float* dst = dx + n * img;
    gemm(GemmAttrs{CRS, P, K, true, false, 1.f, 0.f}, w, dy + n * K * P, pw ? dst : ws, pool);
    if (!pw) col2im(a, ws, dst);
  }
}

// dw (k, c*r*s) = sum_n dy(n) (k, oh*ow) * col(n)^T. Group g sums its images into its own copy (group 0
// into dw); the copies are then added in group order.
void conv2d_backward_filter(const ConvAttrs& a, const float* x, const float* dy, float* dw, float* ws, ThreadPool& pool,
                            bool winograd, const ConvPrologue* pro) {
  if (dnnl_conv(OpKind::Conv2dBackwardFilter, a, x, dy, dw, ws, pool, winograd, nullptr, pro)) return;
  run_prologue(a, pro, pool);
  const int64_t K = a.k, CRS = crs(a), P = ohw(a), img = a.c * a.h * a.w;
  const int64_t wsize = K * CRS;
  const bool pw = is_pointwise(a);
  const size_t col_floats = pw ? 0 : static_cast<size_t>(CRS * P);
  if (images_in_parallel(a, pool.size())) {
    const int64_t groups = filter_groups(a, pool.size());
    float* partial_base = ws + static_cast<size_t>(pool.size()) * col_floats;
    auto partial = [&](int64_t g) {
      return g == 0 ? dw : partial_base + static_cast<size_t>(g - 1) * static_cast<size_t>(wsize);
    };
    pool.run(groups, [&](int64_t g, int slot) {
      float* col = ws + static_cast<size_t>(slot) * col_floats;
      const int64_t b = a.n * g / groups, e = a.n * (g + 1) / groups;
      float* acc = partial(g);
      for (int64_t n = b; n < e; ++n) {
        const float* src = x + n * img;
        if (!pw) im2col(a, src, col);
        sgemm_1t(false, true, K, CRS, P, 1.f, dy + n * K * P, P, pw ? src : col, P, n == b ? 0.f : 1.f, acc, CRS);
      }
    });
    parallel_ranges(pool, wsize, parts_for(wsize * groups, pool), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float s = dw[i];
        for (int64_t g = 1; g < groups; ++g) s += partial(g)[i];
        dw[i] = s;
      }
    });
    return;
  }
  if (a.n == 0) std::fill(dw, dw + wsize, 0.f);
  for (int64_t n = 0; n < a.n; ++n) {
    const float* src = x + n * img;
    if (!pw) im2col(a, src, ws);
    gemm(GemmAttrs{K, CRS, P, false, true, 1.f, n == 0 ? 0.f : 1.f}, dy + n * K * P, pw ? src : ws, dw, pool);
  }
}

// ---- registration ---------------------------------------------------------------------------------------------

namespace {

// A call on 16-bit storage that oneDNN runs natively: x (or dy) and w (or dy) bf16, the output bf16 or float32.
bool bf16_call(const OpCall& c) {
  return c.in.size() == 2 && c.out.size() == 1 && c.in[0].dtype == DType::bf16 && c.in[1].dtype == DType::bf16 &&
         (c.out[0].dtype == DType::bf16 || c.out[0].dtype == DType::f32);
}
std::array<DType, 3> call_types(const OpCall& c) { return {c.in[0].dtype, c.in[1].dtype, c.out[0].dtype}; }

bool all_f32(const OpCall& c) {
  for (const auto* list : {&c.in, &c.out})
    for (const auto& v : *list)
      if (v.dtype != DType::f32) return false;
  return true;
}

// Float32 calls, and the bf16 calls oneDNN has a primitive for (one thread's plan: the primitives depend on the
// geometry and the types, not on how the batch is sliced); every other call the backend converts to float32.
bool conv_takes(const OpCall& c) {
  if (all_f32(c)) return true;
  size_t floats = 0;
  return bf16_call(c) && dnnl_conv_typed_workspace(c.kind, std::get<ConvAttrs>(c.attrs), call_types(c), 1, floats);
}

size_t conv_workspace(const CpuDevice& d, const OpCall& c) {
  const auto* a = std::get_if<ConvAttrs>(&c.attrs);
  if (!a) return 0;
  if (bf16_call(c)) {
    size_t floats = 0;
    return dnnl_conv_typed_workspace(c.kind, *a, call_types(c), d.threads(), floats) ? floats * sizeof(float) : 0;
  }
  return conv_workspace_floats(c.kind, *a, d.threads(), d.winograd()) * sizeof(float);
}

// Runs a bf16 call (conv_takes said yes); false for a float32 one.
bool run_bf16(CpuDevice& d, const OpCall& c) {
  if (!bf16_call(c)) return false;
  const auto& a = attrs<ConvAttrs>(c);
  if (!dnnl_conv_typed(c.kind, a, call_types(c), c.in[0].raw(), c.in[1].raw(), c.out[0].raw(), ws(c),
                       c.workspace.block ? c.workspace.bytes / sizeof(float) : 0, d.pool()))
    throw DeviceError(std::string(op_name(c.kind)) + ": oneDNN has no bf16 convolution for n" + std::to_string(a.n) +
                      " c" + std::to_string(a.c) + " " + std::to_string(a.h) + "x" + std::to_string(a.w) + " k" +
                      std::to_string(a.k) + " " + std::to_string(a.r) + "x" + std::to_string(a.s) +
                      " on this thread count, or the workspace is smaller than it needs");
  return true;
}

}  // namespace

KILN_CPU_KERNEL("conv2d_forward", {[](CpuDevice& d, const OpCall& c) {
                                     if (run_bf16(d, c)) return;
                                     conv2d_forward(attrs<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0), ws(c), d.pool(),
                                                    d.winograd());
                                   },
                                   conv_supports, conv_workspace, conv_takes});
KILN_CPU_KERNEL("conv2d_backward_data", {[](CpuDevice& d, const OpCall& c) {
                                           if (run_bf16(d, c)) return;
                                           conv2d_backward_data(attrs<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0),
                                                                ws(c), d.pool(), d.winograd());
                                         },
                                         conv_supports, conv_workspace, conv_takes});
KILN_CPU_KERNEL("conv2d_backward_filter", {[](CpuDevice& d, const OpCall& c) {
                                             if (run_bf16(d, c)) return;
                                             conv2d_backward_filter(attrs<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0),
                                                                    ws(c), d.pool(), d.winograd());
                                           },
                                           conv_supports, conv_workspace, conv_takes});

}  // namespace kiln::cpu
