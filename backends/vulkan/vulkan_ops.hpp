// The op families of the Vulkan backend; each lives in the file of the same name (gemm.cpp, conv.cpp, ...).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "encoder.hpp"
#include "kiln/device.hpp"

namespace kiln::vulkan {

// Records `call` (already checked against op_arity and op_support).
void run_op(Encoder& e, const OpCall& call);
// Whether this backend runs the op with these attrs on a device with these limits, and why not.
Support op_support(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits);
// Scratch an op would like (the split-K partial sums of conv2d_backward_filter); ops run without it too.
size_t op_workspace_bytes(const OpCall& call, const DeviceLimits& limits);

void run_gemm(Encoder& e, const OpCall& c);
void run_bias(Encoder& e, const OpCall& c);
void run_conv(Encoder& e, const OpCall& c);
size_t conv_workspace_bytes(OpKind kind, const ConvAttrs& a, const DeviceLimits& limits);
void run_pool(Encoder& e, const OpCall& c);
void run_activation(Encoder& e, const OpCall& c);
void run_softmax(Encoder& e, const OpCall& c);
void run_loss(Encoder& e, const OpCall& c);
void run_elementwise(Encoder& e, const OpCall& c);
void run_reduce(Encoder& e, const OpCall& c);
void run_concat(Encoder& e, const OpCall& c);
void run_dropout(Encoder& e, const OpCall& c);
void run_optimizer(Encoder& e, const OpCall& c);
void run_embedding(Encoder& e, const OpCall& c);
void run_layer_norm(Encoder& e, const OpCall& c);
void run_clip(Encoder& e, const OpCall& c);
void run_batched_gemm(Encoder& e, const OpCall& c);  // attention.cpp
void run_permute(Encoder& e, const OpCall& c);       // attention.cpp
void run_batch_norm(Encoder& e, const OpCall& c);

// llvmpipe (lavapipe) counts the loop iterations of each shader invocation, all loops together (nested and
// sequential: gallivm's loop limiter is one counter per invocation, set to 65535 once and decremented at every
// loop back-edge), and silently leaves the running loop when the count runs out. No kernel here may therefore run
// more than kLoopBudget loop iterations in total in one invocation, counted conservatively (a constant loop the
// compiler may unroll counts as if it did not): the host splits long work into several dispatches that
// accumulate, and op_support refuses, with that reason, what cannot be split. Half of the real limit: a margin.
inline constexpr int64_t kLoopBudget = 32768;

// A kernel whose invocations run an outer loop of `outer` iterations (grid-stride, or rows walked in turn), each
// running an inner loop of up to `inner` iterations plus `fixed` others (tree sums, ...): how many outer and
// inner iterations one dispatch may run so that outer * (inner + fixed + 1) <= kLoopBudget. The inner loop is
// split only when it alone does not fit; callers that cannot split it check inner_fits() first (op_support).
struct LoopSplit {
  int64_t outer, inner;
};
inline bool inner_fits(int64_t inner, int64_t fixed) { return inner + fixed + 1 <= kLoopBudget; }
inline LoopSplit split_loops(int64_t outer, int64_t inner, int64_t fixed) {
  outer = std::max<int64_t>(outer, 1);
  inner = std::max<int64_t>(inner, 1);
  const int64_t per = fixed + 1;
  if (outer * (inner + per) <= kLoopBudget) return {outer, inner};
  if (inner + per <= kLoopBudget) return {kLoopBudget / (inner + per), inner};
  return {1, std::max<int64_t>(kLoopBudget - per, 1)};
}

// Runs f(begin, end, groups) over [0, n) in ranges such that a grid-stride loop over the range, with `local`
// invocations per workgroup and `cost` counted iterations per item (its inner loops; the grid-stride loop's own
// iteration is added here), stays within kLoopBudget. One range, as before, for all but huge or costly work.
template <class F>
void for_ranges(const Encoder& e, int64_t n, uint32_t local, int64_t cost, F&& f) {
  if (n <= 0) return;
  const int64_t per_invocation = std::max<int64_t>(1, kLoopBudget / (cost + 1));
  const int64_t span = int64_t{e.groups_for(n, local)} * local * per_invocation;
  for (int64_t b = 0; b < n; b += span) {
    const int64_t end = std::min(n, b + span);
    f(b, end, e.groups_for(end - b, local));
  }
}

// Counted loop iterations of one row of the row kernels (a workgroup of 64 per row): 64-wide passes over the
// columns and 6-level tree reductions. softmax_forward and the cross-entropy: 3 passes, 2 trees; backward: 2, 1.
inline int64_t softmax_row_cost(OpKind kind, int64_t cols) {
  const int64_t steps = (cols + 63) / 64;
  return kind == OpKind::SoftmaxBackward ? 2 * steps + 6 + 1 : 3 * steps + 12 + 1;
}

// Counted loop iterations per row of the layer norm kernels (64 invocations per row): forward three walks of
// the row and two tree sums; backward (dx) two walks and two tree sums.
inline int64_t layer_norm_row_cost(OpKind kind, int64_t cols) {
  const int64_t steps = (cols + 63) / 64;
  return kind == OpKind::LayerNormBackward ? 2 * steps + 12 + 1 : 3 * steps + 12 + 1;
}

// Counted loop iterations per row of softmax_cross_entropy: the softmax row, and with soft labels one more
// walk over the row and a workgroup tree sum (6 levels for 64 invocations).
inline int64_t sce_row_cost(int64_t cols, bool soft_labels) {
  return softmax_row_cost(OpKind::SoftmaxForward, cols) + (soft_labels ? (cols + 63) / 64 + 6 + 1 : 0);
}

// Counted loop iterations per item of the pooling kernels (an output forward, an input backward): the window
// walk (rows, and columns in each), and backward the outputs covering the input (max: each window walked again).
inline int64_t pool_item_cost(OpKind kind, const PoolAttrs& a) {
  const int64_t wh = std::min(a.kh, a.h), ww = std::min(a.kw, a.w);
  const int64_t window = wh * (ww + 1);
  const int64_t cy = std::min((a.kh + a.stride_h - 1) / std::max<int64_t>(a.stride_h, 1), a.oh);
  const int64_t cx = std::min((a.kw + a.stride_w - 1) / std::max<int64_t>(a.stride_w, 1), a.ow);
  const int64_t cover = cy * (cx + 1);
  if (kind == OpKind::MaxPoolForward || kind == OpKind::AvgPoolForward) return window;
  if (kind == OpKind::AvgPoolBackward) return cover;
  return cover + cy * cx * window;
}

// The shared-memory GEMM tile (kernels/vulkan/gemm_tile.glsl) walks K in steps of 16 with its constant inner loops
// unrolled, one counted iteration per step; this many K per dispatch leaves room for the hooks and stores.
inline constexpr int64_t kTileMaxK = 16 * (kLoopBudget - 256);
// The llvmpipe GEMM (kernels/vulkan/gemm_lvp.glsl) runs one counted iteration per 4 steps of K.
inline constexpr int64_t kLvpMaxK = 4 * (kLoopBudget - 256);

// gemm and batched_gemm on llvmpipe: runs the whole op with gemm_lvp_*.comp and returns true, or returns false
// (nothing recorded) when the device is not llvmpipe or the operands do not allow its vec4 loads (gemm.cpp).
bool run_gemm_lvp(Encoder& e, const OpCall& c);
// The same kernel for other ops (the convolutions): `batch` products y_b = alpha op(A_b) op(B_b) + beta y_b with
// A_b at a + b*sa elements (sa = 0: a shared A), B_b at b + b*sb, y_b at y + b*sy. lvp_gemm_ok says whether the
// device and the operands allow it (vec4 loads: the contiguous dimensions, sa and sb multiples of 4, the views
// 16-byte aligned); lvp_gemm records it (K in ranges of kLvpMaxK, batches in ranges of maxComputeWorkGroupCount[2]).
struct LvpGemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 0.f;
  int64_t sa = 0, sb = 0, sy = 0;
};
bool lvp_gemm_ok(const Encoder& e, const LvpGemm& g, const BufferView& a, const BufferView& b);
void lvp_gemm(Encoder& e, const LvpGemm& g, const BufferView& a, const BufferView& b, const BufferView& y);

// Narrowing for push constants; op_support has already refused sizes that do not fit.
inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t ceil_div(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

}  // namespace kiln::vulkan
