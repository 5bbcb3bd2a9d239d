// RMSNorm (semantics: core/ops/rms_norm.cpp): forward and the input gradient one workgroup per row, the gamma
// gradient one invocation per column with rows in order, each split into dispatches within the loop budget.
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

// Counted loop iterations per row (64 invocations per row): forward two walks of the row and one tree sum;
// backward (dx) two walks and one tree sum.
int64_t row_cost(int64_t cols) { return 2 * ((cols + 63) / 64) + 6 + 1; }

// x: (rows, cols), gamma: (cols) -> y: (rows, cols), rstd: (rows)
void run_forward(Encoder& e, const OpCall& c) {
  const auto& a = std::get<LayerNormAttrs>(c.attrs);
  if (a.rows == 0) return;
  const int64_t groups = e.groups_for(a.rows, 1);
  const int64_t rspan = groups * split_loops((a.rows + groups - 1) / groups, row_cost(a.cols), 0).outer;
  for (int64_t r0 = 0; r0 < a.rows; r0 += rspan) {
    const int64_t r1 = std::min(a.rows, r0 + rspan);
    struct {
      uint32_t rows, cols, r0, r1;
      float eps;
    } p{u32(a.rows), u32(a.cols), u32(r0), u32(r1), a.eps};
    e.dispatch("rms_norm_forward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0]), wr(c.out[1])}, p, e.groups_for(r1 - r0, 1));
  }
}

// x, dy: (rows, cols), gamma: (cols), rstd: (rows) -> dx: (rows, cols), dgamma: (cols)
void run_backward(Encoder& e, const OpCall& c) {
  const auto& a = std::get<LayerNormAttrs>(c.attrs);
  if (a.cols == 0) return;
  if (a.rows > 0) {
    const int64_t groups = e.groups_for(a.rows, 1);
    const int64_t rspan = groups * split_loops((a.rows + groups - 1) / groups, row_cost(a.cols), 0).outer;
    for (int64_t r0 = 0; r0 < a.rows; r0 += rspan) {
      const int64_t r1 = std::min(a.rows, r0 + rspan);
      struct {
        uint32_t rows, cols, r0, r1;
      } p{u32(a.rows), u32(a.cols), u32(r0), u32(r1)};
      e.dispatch("rms_norm_backward", {rd(c.in[0]), rd(c.in[1]), rd(c.in[2]), rd(c.in[3]), wr(c.out[0])}, p,
                 e.groups_for(r1 - r0, 1));
    }
  }
  // dgamma: columns over invocations, rows in order; later row ranges accumulate (no rows: zeros).
  const int64_t cgroups = e.groups_for(a.cols);
  const LoopSplit sp = split_loops((a.cols + cgroups * 256 - 1) / (cgroups * 256), a.rows, 0);
  const int64_t cspan = cgroups * 256 * sp.outer;
  for (int64_t c0 = 0; c0 < a.cols; c0 += cspan) {
    const int64_t c1 = std::min(a.cols, c0 + cspan);
    int64_t r0 = 0;
    do {
      const int64_t r1 = std::min(a.rows, r0 + sp.inner);
      struct {
        uint32_t cols, r0, r1, c0, c1, accumulate;
      } p{u32(a.cols), u32(r0), u32(r1), u32(c0), u32(c1), r0 > 0 ? 1u : 0u};
      e.dispatch("rms_norm_param_grad", {rd(c.in[0]), rd(c.in[2]), rd(c.in[3]), r0 > 0 ? rw(c.out[1]) : wr(c.out[1])},
                 p, e.groups_for(c1 - c0));
      r0 = r1;
    } while (r0 < a.rows);
  }
}

Support supports(OpKind, const OpAttrs& attrs, const DeviceLimits&) {
  const int64_t cols = std::get<LayerNormAttrs>(attrs).cols;
  return row_fits(row_cost(cols), 0, "a row of cols = " + std::to_string(cols));
}

}  // namespace

KILN_VULKAN_KERNEL("rms_norm_forward", {run_forward, supports});
KILN_VULKAN_KERNEL("rms_norm_backward", {run_backward, supports});

}  // namespace kiln::vulkan
