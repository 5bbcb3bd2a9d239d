// Gemm: the tiled shared-memory kernel of kernels/vulkan/gemm.comp (64x64 tiles, 8x8 per invocation); on llvmpipe,
// when the operands allow vec4 loads, the barrier-free kernel of kernels/vulkan/gemm_lvp.glsl instead.
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

struct GemmParams {
  uint32_t m, n, k, trans_a, trans_b;
  float alpha, beta;
  uint32_t kchunk, kbegin, kend;
};

}  // namespace

// The llvmpipe kernel reads A and B as vec4: each operand's contiguous dimension must be a multiple of 4 and its
// view must start 16-byte aligned (then every row, and every batch, starts on a vec4). One dispatch per K range
// of kLvpMaxK (the loop budget; later ranges add to y) and per maxComputeWorkGroupCount[2] batches.
constexpr int64_t kLvpTileM = 64, kLvpTileN = 128;  // gemm_lvp.glsl: a workgroup's tile (LVP_R = 32)

bool lvp_gemm_ok(const DeviceLimits& l, const LvpGemm& g, const BufferView& a, const BufferView& b) {
  if (!l.llvmpipe_gemm) return false;
  const bool a_ok = a.offset % 16 == 0 && g.sa % 4 == 0 && (g.trans_a ? g.m % 4 == 0 : g.k % 4 == 0);
  const bool b_ok = b.offset % 16 == 0 && g.sb % 4 == 0 && (g.trans_b ? g.k % 4 == 0 : g.n % 4 == 0);
  return a_ok && b_ok;
}

void lvp_gemm(Encoder& e, const LvpGemm& g, const BufferView& a, const BufferView& b, const BufferView& y) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  static const char* const kNames[8] = {"gemm_lvp_nn",   "gemm_lvp_nt",   "gemm_lvp_tn",   "gemm_lvp_tt",
                                        "gemm_lvp_h_nn", "gemm_lvp_h_nt", "gemm_lvp_h_tn", "gemm_lvp_h_tt"};
  const char* name = kNames[(g.half_ab ? 4 : 0) + (g.trans_a ? 2 : 0) + (g.trans_b ? 1 : 0)];
  const int64_t zmax = std::max<uint32_t>(e.limits().max_groups[2], 1);
  for (int64_t b0 = 0; b0 < g.batch; b0 += zmax) {
    const int64_t nb = std::min(zmax, g.batch - b0);
    int64_t k0 = 0;
    do {
      const int64_t k1 = std::min(g.k, k0 + kLvpMaxK);
      const float beta = k0 == 0 ? g.beta : 1.f;
      struct {
        uint32_t m, n, k;
        float alpha, beta;
        uint32_t kbegin, kend, batch0, sa, sb, sy, y_half;  // y_half: gemm_lvp_h_*.comp only
      } p{u32(g.m), u32(g.n), u32(g.k),  g.alpha,   beta,      u32(k0),
          u32(k1),  u32(b0),  u32(g.sa), u32(g.sb), u32(g.sy), g.half_y ? 1u : 0u};
      e.dispatch(name, {rd(a), rd(b), beta != 0.f ? rw(y) : wr(y)}, p, ceil_div(g.n, kLvpTileN),
                 ceil_div(g.m, kLvpTileM), u32(nb));
      k0 = k1;
    } while (k0 < g.k);
  }
}

namespace {

LvpGemm lvp_of(const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  LvpGemm g;
  g.m = a.m, g.n = a.n, g.k = a.k, g.batch = a.batch, g.trans_a = a.trans_a, g.trans_b = a.trans_b;
  g.alpha = a.alpha, g.beta = a.beta, g.sa = a.m * a.k, g.sb = a.k * a.n, g.sy = a.m * a.n;
  g.half_ab = c.in[0].dtype == DType::f16 && c.in[1].dtype == DType::f16;
  g.half_y = c.out[0].dtype == DType::f16;
  return g;
}

}  // namespace

// Unbound views (the planner's) have offset 0: the decision then rests on the sizes, and the bound call (whose
// views the arena aligns) makes the same one.
bool gemm_takes_types(const OpCall& c, const DeviceLimits& l) {
  const LvpGemm g = lvp_of(c);
  return g.half_ab && c.out[0].dtype != DType::bf16 && lvp_gemm_ok(l, g, c.in[0], c.in[1]);
}

bool run_gemm_lvp(Encoder& e, const OpCall& c) {
  const LvpGemm g = lvp_of(c);
  if (!lvp_gemm_ok(e, g, c.in[0], c.in[1])) return false;
  lvp_gemm(e, g, c.in[0], c.in[1], c.out[0]);
  return true;
}

namespace {

// K runs in ranges of at most kTileMaxK, one dispatch each (the loop budget); later ranges add to y (beta = 1).
void run_gemm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (a.m == 0 || a.n == 0) return;
  if (run_gemm_lvp(e, c)) return;
  // Only float32 gets here: gemm_takes_types accepted 16-bit buffers where run_gemm_lvp runs them.
  int64_t k0 = 0;
  do {
    const int64_t k1 = std::min(a.k, k0 + kTileMaxK);
    const float beta = k0 == 0 ? a.beta : 1.f;
    const GemmParams p{u32(a.m),  u32(a.n), u32(a.k), a.trans_a,
                       a.trans_b, a.alpha,  beta,     u32(std::max<int64_t>(k1 - k0, 1)),
                       u32(k0),   u32(k1)};
    e.dispatch("gemm", {rd(c.in[0]), rd(c.in[1]), beta != 0.f ? rw(c.out[0]) : wr(c.out[0])}, p, ceil_div(a.n, 64),
               ceil_div(a.m, 64));
    k0 = k1;
  } while (k0 < a.k);
}

Support gemm_supports(OpKind, const OpAttrs& attrs, const DeviceLimits& limits) {
  const auto& a = std::get<GemmAttrs>(attrs);
  return tiles_fit(a.m, a.n, limits);  // K of any length: run in ranges of kTileMaxK
}

}  // namespace

KILN_VULKAN_KERNEL("gemm", {.run = run_gemm, .supports = gemm_supports, .takes_types = gemm_takes_types});

}  // namespace kiln::vulkan
