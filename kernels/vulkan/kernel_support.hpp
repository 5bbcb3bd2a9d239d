// What the kernels of kernels/vulkan share: the loop budget and the ways to split work within it, the support
// checks several op families make, the llvmpipe GEMM that the convolutions and batched_gemm reuse, and narrowing for
// push constants. Each op family's kernels, with the lines that register them, live in kernels/vulkan/<family>.cpp.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "encoder.hpp"
#include "kiln/device.hpp"
#include "vulkan_kernel.hpp"

namespace kiln::vulkan {

// llvmpipe (lavapipe) counts the loop iterations of each shader invocation, all loops together (nested and
// sequential: gallivm's loop limiter is one counter per invocation, set to 65535 once and decremented at every
// loop back-edge), and silently leaves the running loop when the count runs out. No kernel here may therefore run
// more than kLoopBudget loop iterations in total in one invocation, counted conservatively (a constant loop the
// compiler may unroll counts as if it did not): the host splits long work into several dispatches that
// accumulate, and the kernels' supports() refuse, with that reason, what cannot be split. Half of the real limit: a
// margin.
inline constexpr int64_t kLoopBudget = 32768;

// A kernel whose invocations run an outer loop of `outer` iterations (grid-stride, or rows walked in turn), each
// running an inner loop of up to `inner` iterations plus `fixed` others (tree sums, ...): how many outer and
// inner iterations one dispatch may run so that outer * (inner + fixed + 1) <= kLoopBudget. The inner loop is
// split only when it alone does not fit; callers that cannot split it check inner_fits() first (row_fits, in
// supports()).
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

// ---- support checks several families share ----------------------------------------------------------------

inline Support no(std::string why) { return {false, std::move(why)}; }

// Tiled kernels launch one workgroup per 64x64 output tile.
inline Support tiles_fit(int64_t rows, int64_t cols, const DeviceLimits& l) {
  if ((cols + 63) / 64 > l.max_groups[0] || (rows + 63) / 64 > l.max_groups[1])
    return no("output of " + std::to_string(rows) + "x" + std::to_string(cols) +
              " needs more 64x64 tiles than maxComputeWorkGroupCount allows");
  return {};
}

// One row (or item) of a kernel must fit the loop budget on its own: the host splits everything else.
inline Support row_fits(int64_t cost, int64_t fixed, const std::string& what) {
  if (inner_fits(cost, fixed)) return {};
  return no(what + " needs " + std::to_string(cost + fixed + 1) +
            " loop iterations in one shader invocation, above the " + std::to_string(kLoopBudget) +
            " these kernels allow themselves (llvmpipe ends an invocation's loops after " + "65535 iterations in all)");
}

// Strides, paddings and windows of the convolutions and pooling.
inline Support window_fits(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t kh, int64_t kw) {
  constexpr int64_t kMax = 32768;  // window arithmetic in the kernels is done in 32-bit ints
  if (sh > kMax || sw > kMax || ph > kMax || pw > kMax || kh > kMax || kw > kMax)
    return no("strides, paddings and window sizes above " + std::to_string(kMax) + " are not supported");
  return {};
}

// ---- the GEMMs -------------------------------------------------------------------------------------------------

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
  // A and B float16 (gemm_lvp_h_*.comp: f16vec4 loads, float32 accumulation); y float16 too (rounded as
  // kiln/half.hpp does). The strides count float16 values then.
  bool half_ab = false, half_y = false;
};
bool lvp_gemm_ok(const DeviceLimits& l, const LvpGemm& g, const BufferView& a, const BufferView& b);
inline bool lvp_gemm_ok(const Encoder& e, const LvpGemm& g, const BufferView& a, const BufferView& b) {
  return lvp_gemm_ok(e.limits(), g, a, b);
}
// gemm and batched_gemm read float16 A and B themselves (VulkanKernel::takes_types) where the llvmpipe kernel runs:
// both operands float16, y float16 or float32, and the vec4 loads allowed.
bool gemm_takes_types(const OpCall& c, const DeviceLimits& l);
void lvp_gemm(Encoder& e, const LvpGemm& g, const BufferView& a, const BufferView& b, const BufferView& y);

// Narrowing for push constants; supports() has already refused sizes that do not fit.
inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t ceil_div(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

}  // namespace kiln::vulkan
