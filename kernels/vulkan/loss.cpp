// The fused losses. Each is two independent dispatches: the gradient (parallel over elements or rows) and the
// scalar loss (one workgroup, fixed-order tree sum), so no workspace is needed and results are deterministic.
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

// Counted loop iterations per row of softmax_cross_entropy: the softmax row, and with soft labels one more
// walk over the row and a workgroup tree sum (6 levels for 64 invocations).
int64_t sce_row_cost(int64_t cols, bool soft_labels) {
  return softmax_row_cost(OpKind::SoftmaxForward, cols) + (soft_labels ? (cols + 63) / 64 + 6 + 1 : 0);
}

void run_loss(Encoder& e, const OpCall& c) {
  const auto& a = std::get<LossAttrs>(c.attrs);
  if (c.kind == OpKind::SoftmaxCrossEntropy) {
    // Both passes walk rows that each cost softmax_row_cost (sce_supports has checked that one fits), in ranges
    // of rows within the loop budget, one dispatch each; the loss's later ranges accumulate.
    const int64_t row_cost = sce_row_cost(a.cols, a.soft_labels);
    struct {
      uint32_t rows, cols;
      float scale;
      uint32_t mode, r0, r1, accumulate, soft;
    } p{u32(a.rows), u32(a.cols), a.scale, 0, 0, 0, 0, a.soft_labels ? 1u : 0u};
    const int64_t groups = e.groups_for(a.rows, 1);
    const int64_t span = groups * split_loops((a.rows + groups - 1) / groups, row_cost, 0).outer;
    for (int64_t r0 = 0; a.cols > 0 && r0 < a.rows; r0 += span) {
      p.r0 = u32(r0);
      p.r1 = u32(std::min(a.rows, r0 + span));
      e.dispatch("softmax_cross_entropy", {rd(c.in[0]), rd(c.in[1]), unused(c.out[0]), wr(c.out[1])}, p,
                 e.groups_for(p.r1 - r0, 1));
    }
    p.mode = 1;
    const int64_t rows_per_pass = split_loops(a.rows, row_cost, 8).outer;
    int64_t r0 = 0;
    do {
      p.r0 = u32(r0);
      p.r1 = u32(std::min(a.rows, r0 + rows_per_pass));
      p.accumulate = r0 > 0;
      e.dispatch("softmax_cross_entropy",
                 {rd(c.in[0]), rd(c.in[1]), r0 > 0 ? rw(c.out[0]) : wr(c.out[0]), unused(c.out[1])}, p, 1);
      r0 += rows_per_pass;
    } while (r0 < a.rows);
    return;
  }
  const uint32_t kind = c.kind == OpKind::MeanSquaredError ? 0 : (a.from_logits ? 1 : 2);
  const float per = a.cols > 0 ? static_cast<float>(double(a.scale) / double(a.cols)) : 0.f;
  const int64_t count = a.rows * a.cols;
  struct {
    uint32_t count;
    float per;
    uint32_t kind, mode, i0, i1, accumulate;
  } p{u32(count), per, kind, 0, 0, 0, 0};
  e.dispatch("loss", {rd(c.in[0]), rd(c.in[1]), unused(c.out[0]), wr(c.out[1])}, p, e.groups_for(count));
  // The scalar loss: one workgroup per slice short enough for one shader loop, later slices accumulate.
  p.mode = 1;
  const int64_t slice = 256 * (kLoopBudget - 16);  // a 256-wide step per iteration, an 8-level tree
  int64_t i0 = 0;
  do {
    p.i0 = u32(i0);
    p.i1 = u32(std::min(count, i0 + slice));
    p.accumulate = i0 > 0;
    e.dispatch("loss", {rd(c.in[0]), rd(c.in[1]), i0 > 0 ? rw(c.out[0]) : wr(c.out[0]), unused(c.out[1])}, p, 1);
    i0 += slice;
  } while (i0 < count);
}

Support sce_supports(OpKind, const OpAttrs& attrs, const DeviceLimits&) {
  const auto& a = std::get<LossAttrs>(attrs);
  return row_fits(sce_row_cost(a.cols, a.soft_labels), 8,
                  "a row of cols = " + std::to_string(a.cols) + (a.soft_labels ? " (probability labels)" : ""));
}

}  // namespace

KILN_VULKAN_KERNEL("softmax_cross_entropy", {run_loss, sce_supports});
KILN_VULKAN_KERNEL("mean_squared_error", {run_loss});
KILN_VULKAN_KERNEL("binary_cross_entropy", {run_loss});

}  // namespace kiln::vulkan
