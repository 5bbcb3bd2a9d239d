// The ops attention is built from: batched GEMM (gemm's shared-memory tile, the batch along z; on llvmpipe the
// gemm_lvp kernel when the operands allow, gemm.cpp) and axis permutation (one invocation per output element).
// Causal softmax is softmax.cpp's.
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

// Batches in ranges of at most maxComputeWorkGroupCount[2], K in ranges of kTileMaxK (the loop budget); later
// K ranges add to y (beta = 1).
void run_batched_gemm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (a.m == 0 || a.n == 0 || a.batch == 0) return;
  if (run_gemm_lvp(e, c)) return;  // llvmpipe (gemm.cpp)
  const int64_t zmax = std::max<uint32_t>(e.limits().max_groups[2], 1);
  for (int64_t b0 = 0; b0 < a.batch; b0 += zmax) {
    const int64_t nb = std::min(zmax, a.batch - b0);
    int64_t k0 = 0;
    do {
      const int64_t k1 = std::min(a.k, k0 + kTileMaxK);
      const float beta = k0 == 0 ? a.beta : 1.f;
      struct {
        uint32_t m, n, k, trans_a, trans_b;
        float alpha, beta;
        uint32_t kchunk, kbegin, kend, batch0;
      } p{u32(a.m), u32(a.n), u32(a.k), a.trans_a, a.trans_b, a.alpha, beta, u32(std::max<int64_t>(k1 - k0, 1)),
          u32(k0),  u32(k1),  u32(b0)};
      e.dispatch("batched_gemm", {rd(c.in[0]), rd(c.in[1]), beta != 0.f ? rw(c.out[0]) : wr(c.out[0])}, p,
                 ceil_div(a.n, 64), ceil_div(a.m, 64), u32(nb));
      k0 = k1;
    } while (k0 < a.k);
  }
}

void run_permute(Encoder& e, const OpCall& c) {
  const auto& a = std::get<PermuteAttrs>(c.attrs);
  int64_t xstride[kPermuteMaxRank], total = 1;
  for (int64_t i = a.rank - 1, s = 1; i >= 0; --i) xstride[i] = s, s *= a.dims[i];
  struct {
    uint32_t rank, begin, end, dims[kPermuteMaxRank], steps[kPermuteMaxRank];
  } p{};
  p.rank = u32(a.rank);
  for (int64_t i = 0; i < a.rank; ++i) {
    p.dims[i] = u32(a.dims[a.perm[i]]);
    p.steps[i] = u32(xstride[a.perm[i]]);
    total *= a.dims[i];
  }
  for_ranges(e, total, 256, kPermuteMaxRank, [&](int64_t b, int64_t end, uint32_t groups) {
    p.begin = u32(b), p.end = u32(end);
    e.dispatch("permute", {rd(c.in[0]), wr(c.out[0])}, p, groups);
  });
}

Support batched_gemm_supports(OpKind, const OpAttrs& attrs, const DeviceLimits& limits) {
  const auto& a = std::get<GemmAttrs>(attrs);
  return tiles_fit(a.m, a.n, limits);  // batches in ranges of maxComputeWorkGroupCount[2], K in kTileMaxK
}

}  // namespace

KILN_VULKAN_KERNEL("batched_gemm",
                   {.run = run_batched_gemm, .supports = batched_gemm_supports, .takes_types = gemm_takes_types});
KILN_VULKAN_KERNEL("permute", {run_permute});

}  // namespace kiln::vulkan
