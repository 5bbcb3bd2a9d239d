// CpuDevice::run_fused (the kRunFused extension): runs of calls the executor hands over, done as one kernel
// where the unfused ops would stream the same tensor through memory two or three times. A fused kernel writes
// every output buffer the calls would, with the same final contents (up to float rounding), so only these
// layouts are fused; anything else (partial overlaps, an output over an input still to be read) runs unfused.
//  - Conv2dForward y0, BiasAdd y1 = y0 + b[k], [ActivationForward relu y2 = relu(y1), [MaxPoolForward of y2]]:
//    the bias, the ReLU and the pool become the conv's epilogue (conv2d_forward with a ConvEpilogue), on each
//    image while it is in cache.
//    Fused when the bias runs in place (y1 == y0), or when y1 is separate and the ReLU writes back over y0
//    (y2 == y0, the planner's ping-pong without [memory] inplace): y0's raw contents are never left behind.
//  - MaxPoolBackward dx, ActivationBackward relu dx in place, its y the pool's x: max_pool_backward with
//    relu_grad (with [memory] inplace = true); [BiasGrad of dx]: each plane of dx is summed as it is finished,
//    while in cache (the same function and order as bias_grad's, so the same bits), instead of read again.
//    [Conv2dBackwardData or Conv2dBackwardFilter of that dx]: the convolution's slices of images each run the pool's
//    planes for their images first (a ConvPrologue), so the convolution reads dx from cache.
//  - Conv2dBackwardData dx, Conv2dBackwardFilter dw of the same convolution and dy (also after the pool above): one
//    pass over the slices that reorders each slice's dy once for both (dnnl_conv_backward_pair), in the filter's
//    workspace, which is sized for it.
//  - BatchNormForward y, ActivationForward relu of y: batch_norm_forward also writes the ReLU's output.
//  - ActivationBackward relu dy, BatchNormBackward of dy (inner >= 16): the ReLU's gradient is computed and written in
//    the batch norm's statistics sweep (batch_norm_backward_relu).
// KILN_CPU_FUSION=0 turns it off (to measure it, or to rule it out).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "backend.hpp"
#include "batch_norm.hpp"
#include "bias.hpp"
#include "conv.hpp"
#include "conv_dnnl.hpp"
#include "pool.hpp"

namespace kiln::cpu {
namespace {

bool same(const BufferView& a, const BufferView& b) {
  return a.block == b.block && a.offset == b.offset && a.bytes == b.bytes;
}

bool disjoint(const BufferView& v, std::initializer_list<const BufferView*> others) {
  for (const BufferView* o : others)
    if (o->bytes && v.overlaps(*o)) return false;
  return true;
}

bool is_relu(const OpCall& c, OpKind kind, int64_t count) {
  if (c.kind != kind) return false;
  const auto* a = std::get_if<ActivationAttrs>(&c.attrs);
  return a && a->act == Activation::relu && a->count == count;
}

// conv, bias [, relu [, max pool]]: how many calls (2-4) fuse, 0 if none. `y` is where the GEMM writes (y1),
// `relu_out` y2, `pool` the max pool's call.
size_t conv_run(std::span<const OpCall> c, const BufferView*& y, const BufferView*& relu_out, const OpCall*& pool) {
  if (c.size() < 2 || c[0].kind != OpKind::Conv2dForward || c[1].kind != OpKind::BiasAdd) return 0;
  const auto& a = std::get<ConvAttrs>(c[0].attrs);
  const auto* b = std::get_if<BiasAttrs>(&c[1].attrs);
  const BufferView &x = c[0].in[0], &w = c[0].in[1], &ws = c[0].workspace, &y0 = c[0].out[0];
  const BufferView &bias = c[1].in[1], &y1 = c[1].out[0];
  if (!b || b->outer != a.n || b->channels != a.k || b->inner != a.oh * a.ow || !same(c[1].in[0], y0)) return 0;
  const bool in_place = same(y1, y0);
  if (!in_place && !disjoint(y1, {&y0, &x, &w, &ws, &bias})) return 0;
  y = &y1;
  relu_out = nullptr;
  pool = nullptr;
  const int64_t count = a.n * a.k * a.oh * a.ow;
  if (c.size() >= 3 && is_relu(c[2], OpKind::ActivationForward, count) && same(c[2].in[0], y1)) {
    const BufferView& y2 = c[2].out[0];
    // y2 over y1 (in place) or exactly over y0 when y1 is separate (then y0 ends up holding y2); otherwise apart.
    const bool ok =
        same(y2, y1) || (in_place ? disjoint(y2, {&y1, &x, &w, &ws, &bias}) : same(y2, y0) && disjoint(y2, {&bias}));
    if (ok) {
      relu_out = &y2;
      // A max pool of y2 into its own buffer, apart from everything the conv, bias and ReLU read or write.
      const BufferView* p = c.size() >= 4 && c[3].kind == OpKind::MaxPoolForward ? &c[3].out[0] : nullptr;
      if (p && same(c[3].in[0], y2) && disjoint(*p, {&y0, &y1, &y2, &x, &w, &ws, &bias})) {
        const auto& pa = std::get<PoolAttrs>(c[3].attrs);
        if (pa.n == a.n && pa.c == a.k && pa.h == a.oh && pa.w == a.ow) {
          pool = &c[3];
          return 4;
        }
      }
      return 3;
    }
  }
  return in_place ? 2 : 0;  // a separate y1 without the ReLU over y0 would leave y0's raw values unwritten
}

// max pool backward, relu backward in place.
bool pool_relu_run(std::span<const OpCall> c) {
  if (c.size() < 2 || c[0].kind != OpKind::MaxPoolBackward) return false;
  const auto& a = std::get<PoolAttrs>(c[0].attrs);
  const BufferView& dx = c[0].out[0];
  return is_relu(c[1], OpKind::ActivationBackward, a.n * a.c * a.h * a.w) && same(c[1].in[0], c[0].in[0]) &&
         same(c[1].in[1], dx) && same(c[1].out[0], dx);
}

// ... then the bias gradient of that dx (a conv layer's bias, NCHW), into a buffer apart from the pool's.
bool pool_relu_bias_run(std::span<const OpCall> c) {
  if (c.size() < 3 || !pool_relu_run(c) || c[2].kind != OpKind::BiasGrad) return false;
  const auto& a = std::get<PoolAttrs>(c[0].attrs);
  const auto* b = std::get_if<BiasAttrs>(&c[2].attrs);
  const BufferView& dx = c[0].out[0];
  return b && b->outer == a.n && b->channels == a.c && b->inner == a.h * a.w && same(c[2].in[0], dx) &&
         disjoint(c[2].out[0], {&dx, &c[0].in[0], &c[0].in[1], &c[0].in[2]});
}

// ... then the backward convolution that reads that dx as its dy (the conv layer's input gradient or its filter
// gradient): fused when the convolution's output, its other input and its workspace are apart from every buffer the
// pool, the ReLU and the bias gradient read or write, since slices of the two interleave.
bool pool_relu_bias_conv_run(std::span<const OpCall> c) {
  if (c.size() < 4 || !pool_relu_bias_run(c)) return false;
  const OpCall& v = c[3];
  if (v.kind != OpKind::Conv2dBackwardData && v.kind != OpKind::Conv2dBackwardFilter) return false;
  const auto& pa = std::get<PoolAttrs>(c[0].attrs);
  const auto* ca = std::get_if<ConvAttrs>(&v.attrs);
  if (!ca || ca->n != pa.n || ca->k != pa.c || ca->oh != pa.h || ca->ow != pa.w) return false;
  const bool data = v.kind == OpKind::Conv2dBackwardData;
  const BufferView &dx = c[0].out[0], &dy = v.in[data ? 0 : 1], &other = v.in[data ? 1 : 0];
  const BufferView &px = c[0].in[0], &py = c[0].in[1], &pdy = c[0].in[2], &db = c[2].out[0];
  if (!same(dy, dx)) return false;
  return disjoint(v.out[0], {&dx, &px, &py, &pdy, &db, &other}) && disjoint(other, {&dx, &db}) &&
         (!v.workspace.block || disjoint(v.workspace, {&dx, &px, &py, &pdy, &db, &other}));
}

// Backward data then backward filter of one convolution (c[at], c[at + 1]) reading the same dy: one pass over the
// slices (dnnl_conv_backward_pair) in backward filter's workspace. Every buffer one of them writes (dx, dw, the
// workspace) is apart from every buffer the other reads, and from `also` (a fused pool's buffers).
bool conv_pair_run(std::span<const OpCall> c, size_t at, std::initializer_list<const BufferView*> also = {}) {
  if (c.size() < at + 2 || c[at].kind != OpKind::Conv2dBackwardData || c[at + 1].kind != OpKind::Conv2dBackwardFilter)
    return false;
  const OpCall &d = c[at], &f = c[at + 1];
  const auto &da = std::get<ConvAttrs>(d.attrs), &fa = std::get<ConvAttrs>(f.attrs);
  const bool same_conv = da.n == fa.n && da.c == fa.c && da.h == fa.h && da.w == fa.w && da.k == fa.k && da.r == fa.r &&
                         da.s == fa.s && da.stride_h == fa.stride_h && da.stride_w == fa.stride_w &&
                         da.pad_h == fa.pad_h && da.pad_w == fa.pad_w && da.oh == fa.oh && da.ow == fa.ow;
  if (!same_conv || !same(d.in[0], f.in[1]) || !f.workspace.block) return false;
  const BufferView &dy = d.in[0], &w = d.in[1], &x = f.in[0], &dx = d.out[0], &dw = f.out[0], &ws = f.workspace;
  if (!disjoint(dx, {&dy, &w, &x, &dw, &ws}) || !disjoint(dw, {&dy, &w, &x, &ws}) || !disjoint(ws, {&dy, &w, &x}))
    return false;
  for (const BufferView* o : also)
    if (!disjoint(*o, {&dx, &dw, &ws})) return false;
  return true;
}

// The pool, ReLU and bias gradient, then such a pair reading their dx: the pair's slices each run the pool's planes
// first.
bool pool_relu_bias_conv_pair_run(std::span<const OpCall> c) {
  if (!pool_relu_bias_conv_run(c) ||
      !conv_pair_run(c, 3, {&c[0].in[0], &c[0].in[1], &c[0].in[2], &c[0].out[0], &c[2].out[0]}))
    return false;
  return disjoint(c[4].in[0], {&c[0].out[0], &c[2].out[0]});  // backward filter's x, read while the pool writes dx
}

// The fused max-pool backward of the images [n0, n1): their planes of dx, with the ReLU's gradient and the bias sums.
struct PoolPrologue {
  const PoolAttrs* a;
  const float *x, *y, *dy;
  float *dx, *sums;
};
void pool_prologue(const void* ctx, int64_t n0, int64_t n1) {
  const auto& p = *static_cast<const PoolPrologue*>(ctx);
  max_pool_backward_planes(*p.a, p.x, p.y, p.dy, p.dx, true, p.sums, n0 * p.a->c, n1 * p.a->c);
}
// The same on bf16 storage (2x2 stride-2 pools: no workspace).
struct PoolPrologueBf16 {
  const PoolAttrs* a;
  const uint16_t *x, *y, *dy;
  uint16_t* dx;
  float* sums;
};
void pool_prologue_bf16(const void* ctx, int64_t n0, int64_t n1) {
  const auto& p = *static_cast<const PoolPrologueBf16*>(ctx);
  max_pool_backward_planes_bf16(*p.a, p.x, p.y, p.dy, p.dx, true, p.sums, n0 * p.a->c, n1 * p.a->c);
}
// Every buffer of calls [0, n) is bf16, but backward filter's dw (its out[0]), which may be float32 too.
bool all_bf16(std::span<const OpCall> c, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (const auto& v : c[i].in)
      if (v.dtype != DType::bf16 && !(c[i].kind == OpKind::BiasGrad)) return false;
    for (const auto& v : c[i].out)
      if (v.dtype != DType::bf16 && c[i].kind != OpKind::Conv2dBackwardFilter && c[i].kind != OpKind::BiasGrad)
        return false;
  }
  return true;
}

// batch norm forward, relu: the normalization pass also writes the ReLU's output. The ReLU reads the batch norm's
// y and writes over it (in place) or into a buffer apart from everything the batch norm reads or writes.
// A synchronized batch norm (`sync`, run by the data-parallel strategy) is never fused.
bool bn_relu_run(std::span<const OpCall> c) {
  if (c.size() < 2 || c[0].kind != OpKind::BatchNormForward) return false;
  const auto& a = std::get<BatchNormAttrs>(c[0].attrs);
  if (a.sync || !is_relu(c[1], OpKind::ActivationForward, a.n * a.c * a.inner)) return false;
  const BufferView &y = c[0].out[0], &z = c[1].out[0];
  if (!same(c[1].in[0], y)) return false;
  return same(z, y) || disjoint(z, {&c[0].in[0], &c[0].in[1], &c[0].in[2], &c[0].out[0], &c[0].out[1], &c[0].out[2],
                                    &c[0].out[3], &c[0].out[4]});
}

// relu backward, batch norm backward of its output (long runs): the ReLU's gradient is computed in the batch norm's
// statistics sweep. dy (the ReLU's output, the batch norm's input) and dx are each exactly one of the buffers the
// ReLU reads or writes (they are then consumed channel by channel before being written), or apart from every buffer.
bool relu_bn_run(std::span<const OpCall> c) {
  if (c.size() < 2 || c[0].kind != OpKind::ActivationBackward || c[1].kind != OpKind::BatchNormBackward) return false;
  const auto& a = std::get<BatchNormAttrs>(c[1].attrs);
  if (a.sync || !batch_norm_long_runs(a) || !is_relu(c[0], OpKind::ActivationBackward, a.n * a.c * a.inner))
    return false;
  const BufferView &ry = c[0].in[0], &dz = c[0].in[1], &dy = c[0].out[0];
  const BufferView &x = c[1].in[0], &gamma = c[1].in[1], &mean = c[1].in[2], &rstd = c[1].in[3];
  const BufferView &dx = c[1].out[0], &dgamma = c[1].out[1], &dbeta = c[1].out[2];
  if (!same(c[1].in[4], dy)) return false;
  const std::initializer_list<const BufferView*> params = {&x, &gamma, &mean, &rstd, &dgamma, &dbeta};
  // v equals one of may_equal, or overlaps none of the ReLU's buffers (v itself aside); never the parameters.
  auto placed = [&](const BufferView& v, std::initializer_list<const BufferView*> may_equal) {
    if (!disjoint(v, params)) return false;
    for (const BufferView* m : may_equal)
      if (same(v, *m)) return true;
    for (const BufferView* o : {&ry, &dz, &dy})
      if (o != &v && o->bytes && v.overlaps(*o)) return false;
    return true;
  };
  return placed(dy, {&dz, &ry}) && placed(dx, {&dz, &ry, &dy}) && disjoint(dgamma, {&dbeta, &ry, &dz, &dy, &x}) &&
         disjoint(dbeta, {&ry, &dz, &dy, &x});
}

// 16-bit runs: the bf16 entry points of float32's fusions (conv + bias + ReLU (+ max pool); batch norm + ReLU,
// forward and backward; max-pool + ReLU backward (+ the conv's bias gradient (+ the backward convolution reading it,
// or its backward pair)); a backward pair alone), bit for bit the bf16 ops; any other 16-bit run is not fused
// (dispatch.cpp converts its calls).
size_t run_fused_bf16(std::span<const OpCall> calls, ThreadPool& threads, std::vector<float>& plane_sums) {
  const BufferView *y = nullptr, *relu_out = nullptr;
  const OpCall* pool = nullptr;
  auto b16 = [](const BufferView& v) { return static_cast<uint16_t*>(v.raw()); };
  if (const size_t k = conv_run(calls, y, relu_out, pool)) {
    const OpCall& c = calls[0];
    if (c.in[0].dtype != DType::bf16 || c.in[1].dtype != DType::bf16 || y->dtype != DType::bf16 ||
        (relu_out && relu_out->dtype != DType::bf16) || (pool && pool->out[0].dtype != DType::bf16) ||
        calls[1].in[1].dtype != DType::f32)
      return 0;
    const ConvEpilogueBf16 ep{calls[1].in[1].host(), relu_out ? b16(*relu_out) : nullptr,
                              pool ? &std::get<PoolAttrs>(pool->attrs) : nullptr, pool ? b16(pool->out[0]) : nullptr};
    if (!dnnl_conv_typed(OpKind::Conv2dForward, std::get<ConvAttrs>(c.attrs), {DType::bf16, DType::bf16, DType::bf16},
                         c.in[0].raw(), c.in[1].raw(), y->raw(), c.workspace.block ? c.workspace.host() : nullptr,
                         c.workspace.block ? c.workspace.bytes / 4 : 0, threads, &ep))
      return 0;
    return k;
  }
  // Batch norm with the ReLU next to it, forward and backward: the bf16 activations (x, y, the ReLU's buffers)
  // bf16, the statistics and parameters float32, as the unfused bf16 kernels take them.
  auto bf16_at = [](const OpCall& c, std::initializer_list<size_t> ins, std::initializer_list<size_t> outs) {
    for (size_t i : ins)
      if (c.in[i].dtype != DType::bf16) return false;
    for (size_t i : outs)
      if (c.out[i].dtype != DType::bf16) return false;
    return true;
  };
  if (bn_relu_run(calls) && bf16_at(calls[0], {0}, {0}) && bf16_at(calls[1], {0}, {0})) {
    const OpCall& c = calls[0];
    batch_norm_forward_bf16(std::get<BatchNormAttrs>(c.attrs), b16(c.in[0]), c.in[1].host(), c.in[2].host(),
                            b16(c.out[0]), c.out[1].host(), c.out[2].host(), c.out[3].host(), c.out[4].host(), threads,
                            b16(calls[1].out[0]));
    return 2;
  }
  if (relu_bn_run(calls) && bf16_at(calls[0], {0, 1}, {0}) && bf16_at(calls[1], {0, 4}, {0})) {
    const OpCall &r = calls[0], &c = calls[1];
    batch_norm_backward_relu_bf16(std::get<BatchNormAttrs>(c.attrs), b16(c.in[0]), c.in[1].host(), c.in[2].host(),
                                  c.in[3].host(), ReluInFrontT<uint16_t>{b16(r.in[0]), b16(r.in[1])}, b16(r.out[0]),
                                  b16(c.out[0]), c.out[1].host(), c.out[2].host(), threads);
    return 2;
  }
  // The backward runs of float32's (below): the pool's planes as each slice's prologue, the pair in one pass.
  auto pool_prologue_of16 = [&](const OpCall& c) {
    const auto& a = std::get<PoolAttrs>(c.attrs);
    plane_sums.resize(static_cast<size_t>(a.n * a.c));
    return PoolPrologueBf16{&a, b16(c.in[0]), b16(c.in[1]), b16(c.in[2]), b16(c.out[0]), plane_sums.data()};
  };
  auto pair16 = [&](const OpCall& d, const OpCall& f, const ConvPrologue* pro) {
    return dnnl_conv_typed_backward_pair(std::get<ConvAttrs>(d.attrs), {f.in[0].dtype, f.in[1].dtype, f.out[0].dtype},
                                         d.in[0].raw(), d.in[1].raw(), f.in[0].raw(), d.out[0].raw(), f.out[0].raw(),
                                         f.workspace.host(), f.workspace.bytes / sizeof(float), threads, pro);
  };
  auto pool_fits = [&](const OpCall& c) {
    return max_pool_bf16_workspace_bytes(std::get<PoolAttrs>(c.attrs), threads.size()) == 0;
  };
  if (pool_relu_bias_conv_pair_run(calls) && all_bf16(calls, 5) && pool_fits(calls[0])) {
    const PoolPrologueBf16 pp = pool_prologue_of16(calls[0]);
    const ConvPrologue pro{pool_prologue_bf16, &pp};
    if (pair16(calls[3], calls[4], &pro)) {
      bias_grad_from_plane_sums(std::get<BiasAttrs>(calls[2].attrs), plane_sums.data(), calls[2].out[0].host());
      return 5;
    }
  }
  if (conv_pair_run(calls, 0) && all_bf16(calls, 2) && pair16(calls[0], calls[1], nullptr)) return 2;
  if (pool_relu_bias_conv_run(calls) && all_bf16(calls, 4) && pool_fits(calls[0])) {
    const OpCall& v = calls[3];
    const PoolPrologueBf16 pp = pool_prologue_of16(calls[0]);
    const ConvPrologue pro{pool_prologue_bf16, &pp};
    const std::array<DType, 3> types{v.in[0].dtype, v.in[1].dtype, v.out[0].dtype};
    if (dnnl_conv_typed(v.kind, std::get<ConvAttrs>(v.attrs), types, v.in[0].raw(), v.in[1].raw(), v.out[0].raw(),
                        v.workspace.block ? v.workspace.host() : nullptr,
                        v.workspace.block ? v.workspace.bytes / sizeof(float) : 0, threads, nullptr, &pro)) {
      bias_grad_from_plane_sums(std::get<BiasAttrs>(calls[2].attrs), plane_sums.data(), calls[2].out[0].host());
      return 4;
    }
  }
  if (pool_relu_bias_run(calls) || pool_relu_run(calls)) {
    const OpCall& c = calls[0];
    for (const auto* v : {&c.in[0], &c.in[1], &c.in[2], &c.out[0]})
      if (v->dtype != DType::bf16) return 0;
    const auto& a = std::get<PoolAttrs>(c.attrs);
    if (max_pool_bf16_workspace_bytes(a, threads.size()) != 0) return 0;
    const bool bias = pool_relu_bias_run(calls);
    if (bias) plane_sums.resize(static_cast<size_t>(a.n * a.c));
    max_pool_backward_bf16(a, b16(c.in[0]), b16(c.in[1]), b16(c.in[2]), b16(c.out[0]), nullptr, threads, true,
                           bias ? plane_sums.data() : nullptr);
    if (bias) bias_grad_from_plane_sums(std::get<BiasAttrs>(calls[2].attrs), plane_sums.data(), calls[2].out[0].host());
    return bias ? 3 : 2;
  }
  return 0;
}

bool fusion_enabled() {
  const char* e = std::getenv("KILN_CPU_FUSION");
  return !(e && std::strcmp(e, "0") == 0);
}

}  // namespace

void* CpuDevice::extension(std::string_view name) {
  static const bool enabled = fusion_enabled();
  if (name == kRunFused && enabled) return static_cast<FusedRunner*>(this);
  return nullptr;
}

size_t CpuDevice::run_fused(std::span<const OpCall> calls) {
  if (calls.size() < 2) return 0;
  bool low = false;
  for (size_t i = 0; i < std::min<size_t>(calls.size(), 6); ++i) {
    for (const auto& v : calls[i].in)
      if (v.dtype != DType::f32) low = true;
    for (const auto& v : calls[i].out)
      if (v.dtype != DType::f32) low = true;
  }
  if (low) return run_fused_bf16(calls, pool_, plane_sums_);
  const BufferView *y = nullptr, *relu_out = nullptr;
  const OpCall* pool = nullptr;
  if (const size_t k = conv_run(calls, y, relu_out, pool)) {
    const OpCall& c = calls[0];
    const ConvEpilogue ep{calls[1].in[1].host(), relu_out ? relu_out->host() : nullptr,
                          pool ? &std::get<PoolAttrs>(pool->attrs) : nullptr, pool ? pool->out[0].host() : nullptr};
    conv2d_forward(std::get<ConvAttrs>(c.attrs), c.in[0].host(), c.in[1].host(), y->host(),
                   c.workspace.block ? c.workspace.host() : nullptr, pool_, winograd_, &ep);
    return k;
  }
  if (bn_relu_run(calls)) {
    const OpCall& c = calls[0];
    batch_norm_forward(std::get<BatchNormAttrs>(c.attrs), c.in[0].host(), c.in[1].host(), c.in[2].host(),
                       c.out[0].host(), c.out[1].host(), c.out[2].host(), c.out[3].host(), c.out[4].host(), pool_,
                       calls[1].out[0].host());
    return 2;
  }
  if (relu_bn_run(calls)) {
    const OpCall &r = calls[0], &c = calls[1];
    batch_norm_backward_relu(std::get<BatchNormAttrs>(c.attrs), c.in[0].host(), c.in[1].host(), c.in[2].host(),
                             c.in[3].host(), ReluInFront{r.in[0].host(), r.in[1].host()}, r.out[0].host(),
                             c.out[0].host(), c.out[1].host(), c.out[2].host(), pool_);
    return 2;
  }
  // The pool's backward as a prologue of the convolution after it (its plane sums give the bias gradient after).
  auto pool_prologue_of = [&](const OpCall& c) {
    const auto& a = std::get<PoolAttrs>(c.attrs);
    plane_sums_.resize(static_cast<size_t>(a.n * a.c));  // grows once, to the largest such layer
    return PoolPrologue{&a, c.in[0].host(), c.in[1].host(), c.in[2].host(), c.out[0].host(), plane_sums_.data()};
  };
  auto bias_from_sums = [&](const OpCall& b) {
    bias_grad_from_plane_sums(std::get<BiasAttrs>(b.attrs), plane_sums_.data(), b.out[0].host());
  };
  // Backward data d and backward filter f as one pass; false where oneDNN does not take the pair.
  auto pair = [&](const OpCall& d, const OpCall& f, const ConvPrologue* pro) {
    return dnnl_conv_backward_pair(std::get<ConvAttrs>(d.attrs), d.in[0].host(), d.in[1].host(), f.in[0].host(),
                                   d.out[0].host(), f.out[0].host(), f.workspace.host(),
                                   f.workspace.bytes / sizeof(float), pool_, winograd_, pro);
  };
  if (pool_relu_bias_conv_pair_run(calls)) {
    const PoolPrologue pp = pool_prologue_of(calls[0]);
    const ConvPrologue pro{pool_prologue, &pp};
    if (pair(calls[3], calls[4], &pro)) {
      bias_from_sums(calls[2]);
      return 5;
    }
  }
  if (conv_pair_run(calls, 0) && pair(calls[0], calls[1], nullptr)) return 2;
  if (pool_relu_bias_conv_run(calls)) {
    // Each slice of the convolution's images first gets its dx planes from the pool, then the convolution reads them
    // while they are in cache, instead of the pool streaming all of dx out to memory and the convolution back in.
    const OpCall& v = calls[3];
    const PoolPrologue pp = pool_prologue_of(calls[0]);
    const ConvPrologue pro{pool_prologue, &pp};
    const auto& ca = std::get<ConvAttrs>(v.attrs);
    float* ws = v.workspace.block ? v.workspace.host() : nullptr;
    if (v.kind == OpKind::Conv2dBackwardData)
      conv2d_backward_data(ca, v.in[0].host(), v.in[1].host(), v.out[0].host(), ws, pool_, winograd_, &pro);
    else
      conv2d_backward_filter(ca, v.in[0].host(), v.in[1].host(), v.out[0].host(), ws, pool_, winograd_, &pro);
    bias_from_sums(calls[2]);
    return 4;
  }
  if (pool_relu_bias_run(calls)) {
    const PoolPrologue pp = pool_prologue_of(calls[0]);
    max_pool_backward(*pp.a, pp.x, pp.y, pp.dy, pp.dx, pool_, true, pp.sums);
    bias_from_sums(calls[2]);
    return 3;
  }
  if (pool_relu_run(calls)) {
    const OpCall& c = calls[0];
    max_pool_backward(std::get<PoolAttrs>(c.attrs), c.in[0].host(), c.in[1].host(), c.in[2].host(), c.out[0].host(),
                      pool_, true);
    return 2;
  }
  return 0;
}

}  // namespace kiln::cpu
