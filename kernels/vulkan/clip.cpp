// Gradient clipping by global norm: sum_squares (one workgroup walking the vector in ranges that accumulate, within
// the loop budget) and clip_by_global_norm (a grid-stride scale).
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_clip(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  if (c.kind == OpKind::SumSquares) {
    // 64 invocations, one counted iteration per 64 elements, plus the 6-level tree.
    const int64_t span = 64 * (kLoopBudget - 16);
    int64_t r0 = 0;
    do {
      const int64_t r1 = std::min(a.count, r0 + span);
      const bool first = r0 == 0;
      struct {
        uint32_t r0, r1, accumulate;
        float alpha, beta;
      } p{u32(r0), u32(r1), !first || a.beta != 0.f, a.alpha, first ? a.beta : 1.f};
      e.dispatch("sum_squares", {rd(c.in[0]), p.accumulate ? rw(c.out[0]) : wr(c.out[0])}, p, 1);
      r0 = r1;
    } while (r0 < a.count);
    return;
  }
  for_ranges(e, a.count, 256, 0, [&](int64_t b, int64_t end, uint32_t groups) {
    struct {
      uint32_t begin, end;
      float max_norm;
    } p{u32(b), u32(end), a.alpha};
    e.dispatch("clip_by_global_norm", {rd(c.in[0]), rw(c.out[0])}, p, groups);
  });
}

}  // namespace

KILN_VULKAN_KERNEL("sum_squares", {run_clip});
KILN_VULKAN_KERNEL("clip_by_global_norm", {run_clip});

}  // namespace kiln::vulkan
