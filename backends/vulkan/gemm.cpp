// Gemm: the tiled shared-memory kernel of kernels/vulkan/gemm.comp (64x64 tiles, 8x8 per invocation).
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct GemmParams {
  uint32_t m, n, k, trans_a, trans_b;
  float alpha, beta;
  uint32_t kchunk, kbegin, kend;
};

}  // namespace

// K runs in ranges of at most kTileMaxK, one dispatch each (the loop budget); later ranges add to y (beta = 1).
void run_gemm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (a.m == 0 || a.n == 0) return;
  int64_t k0 = 0;
  do {
    const int64_t k1 = std::min(a.k, k0 + kTileMaxK);
    const float beta = k0 == 0 ? a.beta : 1.f;
    const GemmParams p{u32(a.m), u32(a.n),  u32(a.k), a.trans_a, a.trans_b, a.alpha, beta, u32(std::max<int64_t>(k1 - k0, 1)),
                       u32(k0),  u32(k1)};
    e.dispatch("gemm", {rd(c.in[0]), rd(c.in[1]), beta != 0.f ? rw(c.out[0]) : wr(c.out[0])}, p, ceil_div(a.n, 64),
               ceil_div(a.m, 64));
    k0 = k1;
  } while (k0 < a.k);
}

}  // namespace kiln::vulkan
