// Convolutions through oneDNN (Debian's libdnnl, the library PyTorch's CPU convolutions run on), where the plugin
// was built with it (KILN_WITH_DNNL). Kiln keeps its own threads: the batch is cut into slices of images (one per
// ThreadPool thread, more where a slice would outgrow a core's L2: slices_for), and each thread runs oneDNN's
// single-threaded primitive on its slices (oneDNN's OpenMP team is held at one thread on the threads that call it),
// so no OpenMP team competes with the pool for the cores and the results depend on the batch and the thread count
// only, as the im2col path's do.
//
// Each slice's tensors are reordered from Kiln's plain NCHW / KCRS into the blocked layouts oneDNN picks for this
// CPU (format_tag::any), run, and the output reordered back: all in the call's workspace (oneDNN's scratchpad in
// user mode included), so the memory planner counts every byte. Backward filter sums the slices' gradients in slice
// order. A backward pass fused after a max-pool backward (fusion.cpp) runs the pool's planes of each slice's images
// (a ConvPrologue) right before the slice's dy is reordered, so dy is read from cache.
//
// Algorithm: oneDNN's direct convolution, or where the device allows it ([device] winograd, on by default) and the
// geometry suits it, its Winograd F(4x4, 3x3) kernels: 3x3 filters at stride 1 with 16 to 256 channels in and out
// and at least 512 output pixels per slice. They do about 2.25x fewer multiplications; measured per pass on an
// AVX-512 host, single-threaded: 1.4-2.7x faster than direct at those shapes, slower outside them (512 channels, a
// single 14x14 image, 8 input channels). Their rounding differs from direct's: relative L2 error 0.6-1.0e-6 on the
// forward pass and backward data, 1-4e-6 on the filter gradient, against 1e-7-level for direct (bench/results/
// cpu_ops.md). Their scratchpad is 6-9 MiB per thread at these shapes, in the workspace like the rest.
//
// bf16 storage (a bfloat16 layer's convolutions, dnnl_conv_typed): the same slices, reorders (those between plain
// NCHW and 16-channel blocks by blocked16 below) and workspace, with
// bf16 x, w and dy (and y or dx bf16 or float32 as the call's buffer says); oneDNN's jit_bf16:avx512_core_bf16
// kernels (vdpbf16ps, float32 accumulation) where the CPU has AVX512_BF16. Backward filter always has its
// primitives write float32 partials, summed in group order and rounded to a bf16 dw once. No Winograd (oneDNN's is
// float32 only); pointwise convolutions and single-channel inputs go to oneDNN too, since the alternative would be
// the float32 im2col path behind conversions of every buffer. A fused bf16 conv + bias + ReLU (+ max pool) brings
// each image back from the blocks with the bias and the ReLU applied as the ops apply them (the same bits), then pools
// it while it is in cache; the backward pair and the pool's prologue run as in float32.
//
// KILN_CPU_DNNL=0 turns it off (the im2col + OpenBLAS path, to measure it or rule it out).
#include "conv_dnnl.hpp"

#ifdef KILN_WITH_DNNL

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "blocked16.hpp"
#include "kiln/half.hpp"
#include "one_omp_thread.hpp"
#include "pool.hpp"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// oneDNN picks its kernels by the CPU it runs on (AVX-512 where there is AVX-512), as OpenBLAS does: holding it to
// AVX2 (set_max_cpu_isa) made the ResNet's convolutions 1.2-2.4x slower on an AVX-512 host.
dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN sizes a primitive's thread partition when the primitive is created (omp_get_max_threads() of the creating
// thread) and runs that many OpenMP threads when it executes, whatever the executing thread's setting then: both
// creation and execution run inside a OneOmpThread (one_omp_thread.hpp).

size_t round_floats(size_t bytes) { return (bytes + 63) / 64 * 16; }  // floats, 64-byte multiples

// The primitive for one op kind and one slice size, with the layouts it chose.
struct Prim {
  dnnl::primitive prim;
  std::string impl;  // oneDNN's name for the implementation it chose (impl_info_str)
  // in0, in1 and out of the Kiln op: the user's plain layout and the primitive's.
  memory::desc user[3], chosen[3];
  bool reorder[3] = {false, false, false};
  dnnl::reorder to_chosen[2];  // for in0 and in1
  dnnl::reorder to_user;       // for out
  // in0, in1, out: reordered by blocked16 instead of oneDNN (bf16 plain <-> 16-channel blocks), with their dims.
  Reorder16 fast[3] = {Reorder16::none, Reorder16::none, Reorder16::none};
  Dims16 dims16[3];
  memory::desc scratch_md;
  size_t scratch_floats = 0;
  int args[3] = {0, 0, 0};  // DNNL_ARG_* of in0, in1, out
  // Forward with an epilogue (Post): the output reordered back a group of `group` images at a time (then one image
  // at a time for the rest), so the epilogue's pool reads each group while it is in cache.
  int64_t group = 0, chosen_stride_n = 0;
  dnnl::reorder to_user_group, to_user_one;
};

// What oneDNN does after a forward convolution: add the bias (its bias argument). The ReLU stays Kiln's (on each
// group of images while in cache): oneDNN's ReLU with alpha 0 is a max with 0, which turns NaN into 0, where
// ActivationForward passes NaN on so the trainer can name the layer it came from.
struct Post {
  bool bias = false;
};

using Key = std::array<int64_t, 17>;  // the op kind, the ConvAttrs, Winograd or not, the Post, the Types

// The storage types of the primitive's in0, in1 and out, in the Kiln op's order (forward: x, w, y; backward data:
// dy, w, dx; backward filter: x, dy, dw). float32 or bf16; oneDNN reads bf16 and accumulates in float32.
struct Types {
  std::array<DType, 3> t{DType::f32, DType::f32, DType::f32};
  bool f32() const { return t[0] == DType::f32 && t[1] == DType::f32 && t[2] == DType::f32; }
  int64_t code() const {
    return static_cast<int64_t>(t[0]) + 4 * static_cast<int64_t>(t[1]) + 16 * static_cast<int64_t>(t[2]);
  }
};
Dt dt_of(DType t) { return t == DType::bf16 ? Dt::bf16 : Dt::f32; }

// The right padding oneDNN needs for Kiln's output size: (size + pl + pr - kernel) / stride + 1 == out.
std::optional<int64_t> pad_right(int64_t size, int64_t kernel, int64_t stride, int64_t pl, int64_t out) {
  int64_t pr = (out - 1) * stride + kernel - size - pl;
  if (pr < 0) pr = 0;
  if ((size + pl + pr - kernel) / stride + 1 != out || pr >= kernel) return std::nullopt;
  return pr;
}

std::unique_ptr<Prim> build(OpKind kind, const ConvAttrs& a, dnnl::algorithm alg, Post post, Types ty) {
  const auto prh = pad_right(a.h, a.r, a.stride_h, a.pad_h, a.oh), prw = pad_right(a.w, a.s, a.stride_w, a.pad_w, a.ow);
  if (!prh || !prw || a.pad_h >= a.r || a.pad_w >= a.s) return nullptr;
  const memory::dims xd{a.n, a.c, a.h, a.w}, wd{a.k, a.c, a.r, a.s}, yd{a.n, a.k, a.oh, a.ow};
  const memory::dims strides{a.stride_h, a.stride_w}, pl{a.pad_h, a.pad_w}, pr{*prh, *prw};
  // The types of x, w and y as this op holds them (Types is in the Kiln op's argument order).
  Dt xt = dt_of(ty.t[0]), wt = dt_of(ty.t[1]), yt = dt_of(ty.t[2]);
  if (kind == OpKind::Conv2dBackwardData) xt = dt_of(ty.t[2]), yt = dt_of(ty.t[0]);
  if (kind == OpKind::Conv2dBackwardFilter) wt = dt_of(ty.t[2]), yt = dt_of(ty.t[1]);
  const memory::desc xa(xd, xt, Tag::any), wa(wd, wt, Tag::any), ya(yd, yt, Tag::any);
  const memory::desc xu(xd, xt, Tag::nchw), wu(wd, wt, Tag::oihw), yu(yd, yt, Tag::nchw);
  // The forward primitive a backward one is created after (its hint): all bf16 for a bf16 op (a forward pass with
  // float32 x and bf16 weights, say, has no implementation), else the op's own descriptors.
  const bool low = !ty.f32();
  const memory::desc xh = low ? memory::desc(xd, Dt::bf16, Tag::any) : xa,
                     wh = low ? memory::desc(wd, Dt::bf16, Tag::any) : wa,
                     yh = low ? memory::desc(yd, Dt::bf16, Tag::any) : ya;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto& eng = engine();
  auto p = std::make_unique<Prim>();
  const OneOmpThread one;
  try {
    const memory::desc ba({a.k}, Dt::f32, Tag::x);
    const bool fwd = kind == OpKind::Conv2dForward;
    const dnnl::convolution_forward::desc fd =
        post.bias
            ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xa, wa, ba, ya, strides, pl, pr)
            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, fwd ? xa : xh, fwd ? wa : wh,
                                              fwd ? ya : yh, strides, pl, pr);
    const dnnl::convolution_forward::primitive_desc fpd(fd, attr, eng);
    // The primitive, its implementation, and for in0, in1, out: the plain layout, the argument and oneDNN's layout.
    auto take = [&](const auto& pd, dnnl::primitive prim, std::array<memory::desc, 3> user, std::array<int, 3> args) {
      p->prim = std::move(prim);
      p->impl = pd.impl_info_str();
      for (int i = 0; i < 3; ++i)
        p->user[i] = user[i], p->args[i] = args[i], p->chosen[i] = pd.query_md(dnnl::query::exec_arg_md, args[i]);
      p->scratch_md = pd.scratchpad_desc();
    };
    switch (kind) {
      case OpKind::Conv2dForward:
        take(fpd, dnnl::convolution_forward(fpd), {xu, wu, yu}, {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST});
        break;
      case OpKind::Conv2dBackwardData: {
        const dnnl::convolution_backward_data::desc bd(alg, xa, wa, ya, strides, pl, pr);
        const dnnl::convolution_backward_data::primitive_desc bpd(bd, attr, eng, fpd);
        take(bpd, dnnl::convolution_backward_data(bpd), {yu, wu, xu},
             {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC});
        break;
      }
      case OpKind::Conv2dBackwardFilter: {
        const dnnl::convolution_backward_weights::desc bd(alg, xa, wa, ya, strides, pl, pr);
        const dnnl::convolution_backward_weights::primitive_desc bpd(bd, attr, eng, fpd);
        take(bpd, dnnl::convolution_backward_weights(bpd), {xu, yu, wu},
             {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS});
        break;
      }
      default:
        return nullptr;
    }
    if (std::getenv("KILN_CPU_DNNL_VERBOSE"))
      std::fprintf(stderr, "kiln cpu: %s n%lld c%lld h%lld w%lld k%lld r%lld s%lld /%lld %s: oneDNN %s\n",
                   std::string(op_name(kind)).c_str(), (long long)a.n, (long long)a.c, (long long)a.h, (long long)a.w,
                   (long long)a.k, (long long)a.r, (long long)a.s, (long long)a.stride_h, low ? "bf16" : "f32",
                   p->impl.c_str());
    if (p->impl.find("ref") != std::string::npos) return nullptr;  // oneDNN's reference loops: im2col is faster
    p->scratch_floats = round_floats(p->scratch_md.get_size());
    for (int i = 0; i < 3; ++i) {
      p->reorder[i] = p->chosen[i] != p->user[i];
      const memory::dims d = p->user[i].dims();
      if (p->reorder[i] && p->user[i].data_type() == Dt::bf16 && d.size() == 4 && d[1] % 16 == 0 &&
          p->user[i] == memory::desc(d, Dt::bf16, Tag::abcd) &&
          p->chosen[i] == memory::desc(d, Dt::bf16, Tag::aBcd16b)) {
        p->fast[i] = i < 2 ? Reorder16::to_blocked : Reorder16::from_blocked;
        p->dims16[i] = {d[0], d[1], d[2] * d[3]};
      }
    }
    for (int i = 0; i < 2; ++i)
      if (p->reorder[i])
        p->to_chosen[i] = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user[i], eng, p->chosen[i]));
    if (p->reorder[2]) p->to_user = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->chosen[2], eng, p->user[2]));
    if (kind == OpKind::Conv2dForward && post.bias && p->reorder[2] && ty.f32()) {
      const auto& blk = p->chosen[2].data;
      if (blk.format_kind != dnnl_blocked || blk.offset0 != 0) return nullptr;
      p->chosen_stride_n = blk.format_desc.blocking.strides[0];
      // About 256 KiB of output per group: the pool reads it from L2 right after the reorder wrote it.
      const int64_t img = a.k * a.oh * a.ow;
      p->group = std::clamp<int64_t>((int64_t{256} << 10) / 4 / std::max<int64_t>(img, 1), 1, a.n);
      auto images = [&](int64_t g) {
        const memory::dims d{g, a.k, a.oh, a.ow};
        const memory::desc from = p->chosen[2].submemory_desc(d, {0, 0, 0, 0}), to(d, Dt::f32, Tag::nchw);
        return dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to));
      };
      p->to_user_group = images(p->group);
      p->to_user_one = images(1);
    }
  } catch (const dnnl::error&) {
    return nullptr;  // not supported by oneDNN: the im2col path runs it
  }
  return p;
}

// Cached primitives, for the process (primitives with user scratchpads may run on several threads at once).
// With `winograd`, Winograd where oneDNN has it for this CPU and geometry, else direct.
const Prim* prim_for(OpKind kind, const ConvAttrs& a, bool winograd, Post post, Types ty) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Prim>> cache;
  const Key key{static_cast<int64_t>(kind),
                a.n,
                a.c,
                a.h,
                a.w,
                a.k,
                a.r,
                a.s,
                a.stride_h,
                a.stride_w,
                a.pad_h,
                a.pad_w,
                a.oh,
                a.ow,
                winograd ? 1 : 0,
                post.bias ? 1 : 0,
                ty.code()};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::unique_ptr<Prim> p;
    if (winograd) p = build(kind, a, dnnl::algorithm::convolution_winograd, post, ty);
    if (!p) p = build(kind, a, dnnl::algorithm::convolution_direct, post, ty);
    it = cache.emplace(key, std::move(p)).first;
  }
  return it->second.get();
}

// The shapes where Winograd was measured faster than direct (top of the file).
bool winograd_suits(const ConvAttrs& a, int64_t slice_images) {
  return a.r == 3 && a.s == 3 && a.stride_h == 1 && a.stride_w == 1 && a.c >= 16 && a.k >= 16 && a.c <= 256 &&
         a.k <= 256 && slice_images * a.oh * a.ow >= 512;
}

bool enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CPU_DNNL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// Slices: at least one per thread, and more where a slice's larger tensor (input or output images) would pass 1 MiB
// (one Zen 4 core's L2), in a multiple of the thread count so every thread runs as many. Each thread then reorders,
// convolves and reorders back a slice that stays in its cache, where whole-batch slices streamed every blocked copy
// and Winograd's transformed tiles through memory: the CNN's step at batch 256 went from 33.8-34.4 to 31.1-31.4 ms,
// the ResNet's from 43.2-43.6 to 40.0-40.7 (2 threads, AVX-512 host; 512 KiB, 2 and 4 MiB were slower).
int64_t slices_for(const ConvAttrs& a, int threads, int64_t elem_bytes) {
  constexpr int64_t kSliceBytes = int64_t{1} << 20;
  const int64_t img_bytes = elem_bytes * std::max(a.c * a.h * a.w, a.k * a.oh * a.ow);
  const int64_t per_slice = std::max<int64_t>(1, kSliceBytes / std::max<int64_t>(img_bytes, 1));
  const int64_t t = std::max(threads, 1);
  const int64_t want = (a.n + per_slice - 1) / per_slice;
  return std::max<int64_t>(1, std::min<int64_t>(a.n, std::max(t, (want + t - 1) / t * t)));
}
int64_t slice_begin(const ConvAttrs& a, int64_t slices, int64_t t) { return a.n * t / slices; }

ConvAttrs with_n(ConvAttrs a, int64_t n) {
  a.n = n;
  return a;
}

// The two slice sizes (floor and ceil of n / slices) and their primitives; null when oneDNN does not take the op.
// The slices are run in `groups` consecutive runs, one per thread: a group's backward-filter gradients are summed
// slice by slice into one partial, so the sum's order depends on the batch and the thread count only.
struct Plan {
  int64_t slices = 0, groups = 0;
  const Prim* small = nullptr;  // n / slices images (may equal big)
  const Prim* big = nullptr;    // ceil(n / slices)
  int64_t n_small = 0, n_big = 0;
  Types types;              // the primitives' (backward filter's dw: always float32, see dw_to_bf16)
  bool dw_to_bf16 = false;  // backward filter into bf16: every group's partial in the workspace, the sum rounded once
  // Workspace, in floats: [shared weights in the chosen layout][per slot: in0, in1, out, scratchpad, one slice's
  // filter gradient (backward filter with more slices than groups)][partials: one filter gradient per group but the
  // first]
  size_t shared = 0, per_slot[5] = {0, 0, 0, 0, 0}, slot_total = 0, partials = 0;
};

std::optional<Plan> plan_for(OpKind kind, const ConvAttrs& a, int threads, bool winograd, Post post = {},
                             Types types = {}) {
  const bool low = !types.f32();
  // Pointwise convolutions are a plain GEMM already; with fewer than 8 input channels (a first layer on gray or RGB
  // images) oneDNN's backward data runs slower than im2col here (1->32 channels: 13x slower), while its forward and
  // backward filter run faster (0.25 and 0.22 ms against 0.31 and 0.52 ms at the CNN's batch 64 on 2 threads).
  // Filters over 1M floats (4 MiB: 512 x 256 x 3 x 3 and up) stay on im2col too: the blocked copies of the filters
  // (and of their gradient, per thread) would grow the workspace by several times their size, and GEMMs that large
  // run near OpenBLAS's peak already.
  // bf16 has no im2col path of its own (it would convert to float32 around it): oneDNN takes pointwise convolutions
  // and few input channels too.
  if (!enabled() || a.n <= 0 || (!low && (a.r * a.s <= 1 || (a.c < 8 && kind == OpKind::Conv2dBackwardData))) ||
      a.k * a.c * a.r * a.s > (int64_t{1} << 20))
    return std::nullopt;
  Plan p;
  p.types = types;
  if (kind == OpKind::Conv2dBackwardFilter && types.t[2] != DType::f32) p.types.t[2] = DType::f32, p.dw_to_bf16 = true;
  p.slices = slices_for(a, threads, low ? 2 : 4);
  p.groups = std::min<int64_t>(p.slices, std::max(threads, 1));
  p.n_small = a.n / p.slices;
  p.n_big = (a.n + p.slices - 1) / p.slices;
  // Both slice sizes take the same algorithm (decided on the smaller), so the slices' results round alike.
  // oneDNN 2.7's Winograd kernels are float32 only.
  const bool wino = !low && winograd && winograd_suits(a, std::max<int64_t>(p.n_small, 1));
  p.big = prim_for(kind, with_n(a, p.n_big), wino, post, p.types);
  p.small = p.n_small == p.n_big ? p.big
                                 : (p.n_small > 0 ? prim_for(kind, with_n(a, p.n_small), wino, post, p.types) : p.big);
  if (!p.big || !p.small) return std::nullopt;
  // One weights reorder serves every slice: both slice sizes must have chosen the same weights layout.
  if (kind != OpKind::Conv2dBackwardFilter && p.small->chosen[1] != p.big->chosen[1]) return std::nullopt;
  for (const Prim* q : {p.small, p.big}) {
    if (kind != OpKind::Conv2dBackwardFilter && q->reorder[1])
      p.shared = std::max(p.shared, round_floats(q->chosen[1].get_size()));
    for (int i = 0; i < 3; ++i) {
      const bool per_slice = (i == 1) ? kind == OpKind::Conv2dBackwardFilter : true;
      if (per_slice && q->reorder[i]) p.per_slot[i] = std::max(p.per_slot[i], round_floats(q->chosen[i].get_size()));
    }
    p.per_slot[3] = std::max(p.per_slot[3], q->scratch_floats);
  }
  const auto wsize = static_cast<size_t>(a.k * a.c * a.r * a.s);
  if (kind == OpKind::Conv2dBackwardFilter) {
    if (p.slices > p.groups) p.per_slot[4] = round_floats(wsize * 4);
    p.partials = static_cast<size_t>(p.groups - (p.dw_to_bf16 ? 0 : 1)) * wsize;
  }
  p.slot_total = p.per_slot[0] + p.per_slot[1] + p.per_slot[2] + p.per_slot[3] + p.per_slot[4];
  return p;
}

size_t workspace_floats(const Plan& p, int threads) {
  return p.shared + static_cast<size_t>(std::max(threads, 1)) * p.slot_total + p.partials;
}

// Argument i of q (0 or 1) in q's layout: reordered from `user` into `buf` where the layouts differ, else `user`
// itself.
memory chosen_arg(const Prim& q, int i, void* user, float* buf, dnnl::stream& s) {
  memory m(q.chosen[i], engine(), q.reorder[i] ? buf : user);
  if (q.fast[i] != Reorder16::none) {
    blocked16(q.fast[i], q.dims16[i], static_cast<const uint16_t*>(user), reinterpret_cast<uint16_t*>(buf));
  } else if (q.reorder[i]) {
    memory src(q.user[i], engine(), user);
    q.to_chosen[i].execute(s, src, m);
  }
  return m;
}
// q's output: where it is written (`buf` where it must be reordered back, else `user`), then back to `user`.
memory chosen_out(const Prim& q, void* user, float* buf) {
  return memory(q.chosen[2], engine(), q.reorder[2] ? buf : user);
}
void out_to_user(const Prim& q, memory& chosen, void* user, dnnl::stream& s) {
  if (q.fast[2] != Reorder16::none) {
    s.wait();  // the primitive's output is complete
    blocked16(q.fast[2], q.dims16[2], static_cast<const uint16_t*>(chosen.get_data_handle()),
              static_cast<uint16_t*>(user));
  } else if (q.reorder[2]) {
    memory dst(q.user[2], engine(), user);
    q.to_user.execute(s, chosen, dst);
  }
}

// The weights in the layout forward and backward data chose, reordered once into the start of the workspace for
// every slice (on the calling thread), or w itself where no reorder is needed.
const void* shared_weights(const Plan& p, const void* w, float* ws) {
  if (!p.big->reorder[1]) return w;
  dnnl::stream s(engine());
  memory src(p.big->user[1], engine(), const_cast<void*>(w)), dst(p.big->chosen[1], engine(), ws);
  p.big->to_chosen[1].execute(s, src, dst);
  s.wait();
  return ws;
}

// Backward filter: the groups' partials (the first group's is dw itself) summed into dw, in group order.
void sum_partials(const Plan& p, int64_t wsize, float* dw, const float* partial_base, ThreadPool& pool) {
  if (p.groups > 1)
    parallel_ranges(pool, wsize, parts_for(wsize * p.groups, pool), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        float v = dw[i];
        for (int64_t t = 1; t < p.groups; ++t) v += partial_base[static_cast<size_t>(t - 1) * wsize + i];
        dw[i] = v;
      }
    });
}
// The same into a bf16 dw: every group's partial is in the workspace (group 0's first), summed in group order in
// float32 and rounded once.
void sum_partials_bf16(const Plan& p, int64_t wsize, uint16_t* dw, const float* partial_base, ThreadPool& pool) {
  parallel_ranges(pool, wsize, parts_for(wsize * p.groups, pool), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float v = partial_base[i];
      for (int64_t t = 1; t < p.groups; ++t) v += partial_base[static_cast<size_t>(t) * wsize + i];
      dw[i] = float_to_bf16(v);
    }
  });
}

// With `ep` (forward only), each slice's epilogue runs right after its images are back in the plain layout; with
// `bias_done` the primitives added the bias (Post::bias) and reorder the output back a group of images at a time.
void run_plan(OpKind kind, const ConvAttrs& a, const Plan& p, const void* in0, const void* in1, void* out, float* ws,
              ThreadPool& pool, const ConvEpilogue* ep = nullptr, bool bias_done = false,
              const ConvPrologue* pro = nullptr, const ConvEpilogueBf16* ep16 = nullptr) {
  auto& eng = engine();
  const OneOmpThread one;
  // Weights shared by every slice (forward, backward data).
  const void* w_chosen = kind != OpKind::Conv2dBackwardFilter ? shared_weights(p, in1, ws) : in1;
  // Bytes per value of in0, in1 and out (backward filter's primitives write float32).
  const int64_t es[3] = {static_cast<int64_t>(dtype_size(p.types.t[0])), static_cast<int64_t>(dtype_size(p.types.t[1])),
                         static_cast<int64_t>(dtype_size(p.types.t[2]))};
  const int64_t x_img = a.c * a.h * a.w, y_img = a.k * a.oh * a.ow, wsize = a.k * a.c * a.r * a.s;
  // Per Kiln op: in0's and out's image sizes (backward filter: in1 is dy, sliced too).
  int64_t in0_img = x_img, in1_img = 0, out_img = y_img;
  if (kind == OpKind::Conv2dBackwardData) in0_img = y_img, out_img = x_img;
  if (kind == OpKind::Conv2dBackwardFilter) in1_img = y_img, out_img = 0;
  float* partial_base = ws + p.shared + static_cast<size_t>(pool.size()) * p.slot_total;
  pool.run(p.groups, [&](int64_t grp, int slot) {
    const OneOmpThread one_here;
    float* sbuf = ws + p.shared + static_cast<size_t>(slot) * p.slot_total;
    float* bufs[5] = {sbuf, sbuf + p.per_slot[0], sbuf + p.per_slot[0] + p.per_slot[1],
                      sbuf + p.per_slot[0] + p.per_slot[1] + p.per_slot[2],
                      sbuf + p.per_slot[0] + p.per_slot[1] + p.per_slot[2] + p.per_slot[3]};
    // Backward filter: the group's first slice writes the group's partial (the first group's: out), the others a
    // slot buffer that is then added to it.
    float* group_dw = p.dw_to_bf16 ? partial_base + static_cast<size_t>(grp) * static_cast<size_t>(wsize)
                      : grp == 0   ? static_cast<float*>(out)
                                   : partial_base + static_cast<size_t>(grp - 1) * static_cast<size_t>(wsize);
    const int64_t t0 = p.slices * grp / p.groups, t1 = p.slices * (grp + 1) / p.groups;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = slice_begin(a, p.slices, t), n = slice_begin(a, p.slices, t + 1) - b;
      const Prim& q = n == p.n_big ? *p.big : *p.small;
      if (pro) (*pro)(b, b + n);  // this slice's dy, while the reorder below can still find it in cache
      dnnl::stream s(eng);
      const void* user_in[2] = {
          static_cast<const char*>(in0) + b * in0_img * es[0],
          kind == OpKind::Conv2dBackwardFilter ? static_cast<const char*>(in1) + b * in1_img * es[1] : w_chosen};
      void* user_out = kind == OpKind::Conv2dBackwardFilter ? static_cast<void*>(t == t0 ? group_dw : bufs[4])
                                                            : static_cast<char*>(out) + b * out_img * es[2];
      std::unordered_map<int, memory> args;
      for (int i = 0; i < 2; ++i) {
        const bool weights_done = i == 1 && kind != OpKind::Conv2dBackwardFilter;  // shared, already in its layout
        args.emplace(q.args[i], weights_done ? memory(q.chosen[i], eng, const_cast<void*>(user_in[i]))
                                             : chosen_arg(q, i, const_cast<void*>(user_in[i]), bufs[i], s));
      }
      memory out_chosen = chosen_out(q, user_out, bufs[2]);
      args.emplace(q.args[2], out_chosen);
      if (bias_done)
        args.emplace(DNNL_ARG_BIAS, memory(memory::desc({a.k}, Dt::f32, Tag::x), eng, const_cast<float*>(ep->bias)));
      if (q.scratch_floats) args.emplace(DNNL_ARG_SCRATCHPAD, memory(q.scratch_md, eng, bufs[3]));
      q.prim.execute(s, args);
      if (ep16 && q.fast[2] == Reorder16::from_blocked) {
        // A bf16 layer's fused forward: each image back from the slice's blocks into y with the bias and (where it
        // writes y in place) the ReLU on the way, then the pool, while the image is in cache.
        s.wait();
        const uint16_t* blocked = reinterpret_cast<const uint16_t*>(bufs[2]);
        auto* y = static_cast<uint16_t*>(out);
        const bool relu_in_place = ep16->relu_out == y;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t img = b + i;
          blocked16(Reorder16::from_blocked, Dims16{1, a.k, a.oh * a.ow}, blocked + i * out_img, y + img * out_img,
                    ep16->bias, relu_in_place);
          if (ep16->relu_out && !relu_in_place)
            conv_epilogue_bf16(a, ConvEpilogueBf16{nullptr, ep16->relu_out, nullptr, nullptr}, y, img, img + 1);
          if (ep16->relu_out && ep16->pool && ep16->pool_out)
            max_pool_planes_bf16(*ep16->pool, ep16->relu_out, ep16->pool_out, img * a.k, (img + 1) * a.k);
        }
      } else if (bias_done && q.reorder[2]) {
        // A group of images at a time back into the plain layout, each group's epilogue while it is in cache.
        for (int64_t i = 0; i < n;) {
          const int64_t g = n - i >= q.group ? q.group : 1;
          const memory::dims d{g, a.k, a.oh, a.ow};
          memory from(q.chosen[2].submemory_desc(d, {0, 0, 0, 0}), eng, bufs[2] + i * q.chosen_stride_n);
          memory to(memory::desc(d, Dt::f32, Tag::nchw), eng, static_cast<float*>(user_out) + i * out_img);
          (g == q.group ? q.to_user_group : q.to_user_one).execute(s, from, to);
          s.wait();
          conv_epilogue(a, *ep, false, static_cast<float*>(out), b + i, b + i + g);
          i += g;
        }
      } else {
        out_to_user(q, out_chosen, user_out, s);
        s.wait();
        if (ep) conv_epilogue(a, *ep, !bias_done, static_cast<float*>(out), b, b + n);
        if (ep16) conv_epilogue_bf16(a, *ep16, static_cast<uint16_t*>(out), b, b + n);
      }
      if (kind == OpKind::Conv2dBackwardFilter && t != t0)
        for (int64_t i = 0; i < wsize; ++i) group_dw[i] += bufs[4][i];
    }
  });
  if (kind == OpKind::Conv2dBackwardFilter) {
    if (p.dw_to_bf16)
      sum_partials_bf16(p, wsize, static_cast<uint16_t*>(out), partial_base, pool);
    else
      sum_partials(p, wsize, static_cast<float*>(out), partial_base, pool);
  }
}

// Backward data and backward filter of one convolution together (a dx and a dw from one dy), slice by slice: each
// slice's dy is reordered once for both primitives, where the two ops would each reorder all of dy. The slices, their
// primitives and the order of the filter's sums are the two ops' own, so dx and dw are bit for bit theirs.
struct PairPlan {
  Plan data, filter;
  // Per slot: x, dy, dx and dw in oneDNN's layouts, one scratchpad (the two primitives run one after the other),
  // one slice's filter gradient; before the slots the weights in backward data's layout; after them the partials.
  size_t slot[6] = {0, 0, 0, 0, 0, 0}, slot_total = 0;
  size_t floats(int threads) const {
    return data.shared + static_cast<size_t>(std::max(threads, 1)) * slot_total + filter.partials;
  }
};

// ftypes: backward filter's (x, dy, dw); float32 for a float32 pair. A bf16 pair reads bf16 dy, w and x, writes a
// bf16 dx, and dw in ftypes[2].
std::optional<PairPlan> pair_plan(const ConvAttrs& a, int threads, bool winograd, Types ftypes = {}) {
  const Types dtypes = ftypes.f32() ? Types{} : Types{{ftypes.t[1], ftypes.t[1], ftypes.t[1]}};
  auto d = plan_for(OpKind::Conv2dBackwardData, a, threads, winograd, {}, dtypes);
  auto f = plan_for(OpKind::Conv2dBackwardFilter, a, threads, winograd, {}, ftypes);
  if (!d || !f || d->slices != f->slices || d->groups != f->groups || d->n_big != f->n_big || d->n_small != f->n_small)
    return std::nullopt;
  // dy in one layout for both, at both slice sizes.
  for (auto [dq, fq] : {std::pair{d->big, f->big}, std::pair{d->small, f->small}})
    if (dq->chosen[0] != fq->chosen[1] || dq->reorder[0] != fq->reorder[1]) return std::nullopt;
  PairPlan q{*d, *f};
  q.slot[0] = f->per_slot[0];
  q.slot[1] = std::max(d->per_slot[0], f->per_slot[1]);
  q.slot[2] = d->per_slot[2];
  q.slot[3] = f->per_slot[2];
  q.slot[4] = std::max(d->per_slot[3], f->per_slot[3]);
  q.slot[5] = f->per_slot[4];
  for (size_t v : q.slot) q.slot_total += v;
  return q;
}

// The pair, in float32 or bf16 (q's plans say which: element sizes from their types; a bf16 dw has every group's
// partial in the workspace, summed and rounded once, as backward filter alone does).
void run_pair(const ConvAttrs& a, const PairPlan& q, const void* dy, const void* w, const void* x, void* dx, void* dw,
              float* ws, ThreadPool& pool, const ConvPrologue* pro) {
  auto& eng = engine();
  const OneOmpThread one;
  const Plan &pd = q.data, &pf = q.filter;
  const void* w_chosen = shared_weights(pd, w, ws);
  const int64_t es = static_cast<int64_t>(dtype_size(pd.types.t[0]));  // dy, w, x and dx: one type
  const int64_t x_img = a.c * a.h * a.w, y_img = a.k * a.oh * a.ow, wsize = a.k * a.c * a.r * a.s;
  float* partial_base = ws + pd.shared + static_cast<size_t>(pool.size()) * q.slot_total;
  auto at = [](const void* p, int64_t bytes) { return const_cast<char*>(static_cast<const char*>(p)) + bytes; };
  pool.run(pf.groups, [&](int64_t grp, int slot) {
    const OneOmpThread one_here;
    float* b0 = ws + pd.shared + static_cast<size_t>(slot) * q.slot_total;
    float* buf[6];
    for (int i = 0; i < 6; ++i) buf[i] = b0, b0 += q.slot[i];
    float* group_dw = pf.dw_to_bf16 ? partial_base + static_cast<size_t>(grp) * static_cast<size_t>(wsize)
                      : grp == 0    ? static_cast<float*>(dw)
                                    : partial_base + static_cast<size_t>(grp - 1) * static_cast<size_t>(wsize);
    const int64_t t0 = pf.slices * grp / pf.groups, t1 = pf.slices * (grp + 1) / pf.groups;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = slice_begin(a, pf.slices, t), n = slice_begin(a, pf.slices, t + 1) - b;
      const Prim& dq = n == pd.n_big ? *pd.big : *pd.small;
      const Prim& fq = n == pf.n_big ? *pf.big : *pf.small;
      if (pro) (*pro)(b, b + n);
      dnnl::stream s(eng);
      memory dy_mem = chosen_arg(dq, 0, at(dy, b * y_img * es), buf[1], s);
      // Backward data: dx of this slice.
      {
        std::unordered_map<int, memory> args;
        args.emplace(DNNL_ARG_DIFF_DST, dy_mem);
        args.emplace(DNNL_ARG_WEIGHTS, memory(dq.chosen[1], eng, const_cast<void*>(w_chosen)));
        memory dx_mem = chosen_out(dq, at(dx, b * x_img * es), buf[2]);
        args.emplace(DNNL_ARG_DIFF_SRC, dx_mem);
        if (dq.scratch_floats) args.emplace(DNNL_ARG_SCRATCHPAD, memory(dq.scratch_md, eng, buf[4]));
        dq.prim.execute(s, args);
        out_to_user(dq, dx_mem, at(dx, b * x_img * es), s);
      }
      // Backward filter from the same dy: the group's first slice into the group's partial, the others into a slot
      // buffer added to it.
      {
        float* user_out = t == t0 ? group_dw : buf[5];
        std::unordered_map<int, memory> args;
        args.emplace(DNNL_ARG_SRC, chosen_arg(fq, 0, at(x, b * x_img * es), buf[0], s));
        args.emplace(DNNL_ARG_DIFF_DST, memory(fq.chosen[1], eng, dy_mem.get_data_handle()));
        memory dw_mem = chosen_out(fq, user_out, buf[3]);
        args.emplace(DNNL_ARG_DIFF_WEIGHTS, dw_mem);
        if (fq.scratch_floats) args.emplace(DNNL_ARG_SCRATCHPAD, memory(fq.scratch_md, eng, buf[4]));
        fq.prim.execute(s, args);
        out_to_user(fq, dw_mem, user_out, s);
      }
      s.wait();
      if (t != t0)
        for (int64_t i = 0; i < wsize; ++i) group_dw[i] += buf[5][i];
    }
  });
  if (pf.dw_to_bf16)
    sum_partials_bf16(pf, wsize, static_cast<uint16_t*>(dw), partial_base, pool);
  else
    sum_partials(pf, wsize, static_cast<float*>(dw), partial_base, pool);
}

}  // namespace

bool dnnl_conv_workspace(OpKind kind, const ConvAttrs& a, int threads, bool winograd, size_t& floats) {
  const auto p = plan_for(kind, a, threads, winograd);
  if (!p) return false;
  floats = workspace_floats(*p, threads);
  // Backward filter's workspace also holds the pair (backward data and filter together), which runs in it.
  if (kind == OpKind::Conv2dBackwardFilter)
    if (const auto q = pair_plan(a, threads, winograd)) floats = std::max(floats, q->floats(threads));
  return true;
}

bool dnnl_conv_typed_workspace(OpKind kind, const ConvAttrs& a, const std::array<DType, 3>& types, int threads,
                               size_t& floats) {
  const auto p = plan_for(kind, a, threads, false, {}, Types{types});
  if (!p) return false;
  floats = workspace_floats(*p, threads);
  // Backward filter's workspace also holds the pair, as in float32, where that room stays below what float32 copies
  // of x, dy and dw would take (a bf16 convolution never asks more than converting it would; at small batches the
  // pair's per-thread blocked copies do). Without the room the pair is not fused.
  if (kind == OpKind::Conv2dBackwardFilter && types[0] == DType::bf16 && types[1] == DType::bf16)
    if (const auto q = pair_plan(a, threads, false, Types{types})) {
      const auto copies = static_cast<size_t>(a.n * (a.c * a.h * a.w + a.k * a.oh * a.ow) + a.k * a.c * a.r * a.s);

      if (q->floats(threads) < copies) floats = std::max(floats, q->floats(threads));
    }
  return true;
}

bool dnnl_conv_typed(OpKind kind, const ConvAttrs& a, const std::array<DType, 3>& types, const void* in0,
                     const void* in1, void* out, float* ws, size_t ws_floats, ThreadPool& pool,
                     const ConvEpilogueBf16* ep, const ConvPrologue* pro) {
  const auto p = plan_for(kind, a, pool.size(), false, {}, Types{types});
  if (!p || ws_floats < workspace_floats(*p, pool.size())) return false;
  if (kind != OpKind::Conv2dForward || types[2] != DType::bf16) ep = nullptr;
  if (kind == OpKind::Conv2dForward) pro = nullptr;
  run_plan(kind, a, *p, in0, in1, out, ws, pool, nullptr, false, pro, ep);
  return true;
}

bool dnnl_conv_typed_backward_pair(const ConvAttrs& a, const std::array<DType, 3>& ftypes, const void* dy,
                                   const void* w, const void* x, void* dx, void* dw, float* ws, size_t ws_floats,
                                   ThreadPool& pool, const ConvPrologue* pro) {
  if (ftypes[0] != DType::bf16 || ftypes[1] != DType::bf16) return false;
  const auto q = pair_plan(a, pool.size(), false, Types{ftypes});
  if (!q || ws_floats < q->floats(pool.size())) return false;
  run_pair(a, *q, dy, w, x, dx, dw, ws, pool, pro);
  return true;
}

bool dnnl_conv_backward_pair(const ConvAttrs& a, const float* dy, const float* w, const float* x, float* dx, float* dw,
                             float* ws, size_t ws_floats, ThreadPool& pool, bool winograd, const ConvPrologue* pro) {
  const auto q = pair_plan(a, pool.size(), winograd);
  if (!q || ws_floats < q->floats(pool.size())) return false;
  run_pair(a, *q, dy, w, x, dx, dw, ws, pool, pro);
  return true;
}

bool dnnl_conv(OpKind kind, const ConvAttrs& a, const float* in0, const float* in1, float* out, float* ws,
               ThreadPool& pool, bool winograd, const ConvEpilogue* ep, const ConvPrologue* pro) {
  const auto p = plan_for(kind, a, pool.size(), winograd);
  if (!p) return false;
  if (kind != OpKind::Conv2dForward)
    ep = nullptr;  // epilogues are forward's, prologues backward's
  else
    pro = nullptr;
  if (ep && ep->bias) {
    // The primitives with the bias, where they fit the workspace the op was given (sized without them).
    const auto q = plan_for(kind, a, pool.size(), winograd, Post{true});
    if (q && q->big->group > 0 && q->small->group > 0 &&
        workspace_floats(*q, pool.size()) <= workspace_floats(*p, pool.size()) && q->slot_total <= p->slot_total &&
        q->shared <= p->shared) {
      run_plan(kind, a, *q, in0, in1, out, ws, pool, ep, true);
      return true;
    }
  }
  run_plan(kind, a, *p, in0, in1, out, ws, pool, ep, false, pro);
  return true;
}

}  // namespace kiln::cpu

#else

namespace kiln::cpu {
bool dnnl_conv_workspace(OpKind, const ConvAttrs&, int, bool, size_t&) { return false; }
bool dnnl_conv(OpKind, const ConvAttrs&, const float*, const float*, float*, float*, ThreadPool&, bool,
               const ConvEpilogue*, const ConvPrologue*) {
  return false;
}
bool dnnl_conv_backward_pair(const ConvAttrs&, const float*, const float*, const float*, float*, float*, float*, size_t,
                             ThreadPool&, bool, const ConvPrologue*) {
  return false;
}
bool dnnl_conv_typed_workspace(OpKind, const ConvAttrs&, const std::array<DType, 3>&, int, size_t&) { return false; }
bool dnnl_conv_typed(OpKind, const ConvAttrs&, const std::array<DType, 3>&, const void*, const void*, void*, float*,
                     size_t, ThreadPool&, const ConvEpilogueBf16*, const ConvPrologue*) {
  return false;
}
bool dnnl_conv_typed_backward_pair(const ConvAttrs&, const std::array<DType, 3>&, const void*, const void*, const void*,
                                   void*, void*, float*, size_t, ThreadPool&, const ConvPrologue*) {
  return false;
}
}  // namespace kiln::cpu

#endif
