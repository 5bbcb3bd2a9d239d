// Gemm: the tiled shared-memory kernel of kernels/vulkan/gemm.comp (64x64 tiles, 4x4 per invocation).
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

struct GemmParams {
  uint32_t m, n, k, trans_a, trans_b;
  float alpha, beta;
  uint32_t kchunk;
};

}  // namespace

void run_gemm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<GemmAttrs>(c.attrs);
  if (a.m == 0 || a.n == 0) return;
  const GemmParams p{u32(a.m), u32(a.n), u32(a.k), a.trans_a, a.trans_b, a.alpha, a.beta,
                     u32(std::max<int64_t>(a.k, 1))};
  e.dispatch("gemm", {rd(c.in[0]), rd(c.in[1]), a.beta != 0.f ? rw(c.out[0]) : wr(c.out[0])}, p, ceil_div(a.n, 64),
             ceil_div(a.m, 64));
}

}  // namespace kiln::vulkan
