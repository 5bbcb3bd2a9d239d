// Row-wise softmax forward and backward: one workgroup per row with tree reductions.
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_softmax(Encoder& e, const OpCall& c) {
  const auto& a = std::get<SoftmaxAttrs>(c.attrs);
  if (a.cols == 0 || a.rows == 0) return;
  const bool fwd = c.kind == OpKind::SoftmaxForward;
  // Ranges of rows, one dispatch each, within the loop budget: a workgroup walks its rows, each taking
  // softmax_row_cost (softmax_supports has checked that one row fits).
  const int64_t groups = e.groups_for(a.rows, 1);
  const LoopSplit sp = split_loops((a.rows + groups - 1) / groups, softmax_row_cost(c.kind, a.cols), 0);
  for (int64_t r0 = 0; r0 < a.rows; r0 += groups * sp.outer) {
    const int64_t r1 = std::min(a.rows, r0 + groups * sp.outer);
    struct {
      uint32_t rows, cols, r0, r1;
    } p{u32(a.rows), u32(a.cols), u32(r0), u32(r1)};
    struct {
      uint32_t rows, cols, r0, r1, causal;
    } pf{p.rows, p.cols, p.r0, p.r1, a.causal ? 1u : 0u};
    if (fwd)
      e.dispatch("softmax_forward", {rd(c.in[0]), wr(c.out[0])}, pf, e.groups_for(r1 - r0, 1));
    else
      e.dispatch("softmax_backward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(r1 - r0, 1));
  }
}

Support softmax_supports(OpKind kind, const OpAttrs& attrs, const DeviceLimits&) {
  const int64_t cols = std::get<SoftmaxAttrs>(attrs).cols;
  return row_fits(softmax_row_cost(kind, cols), 0, "a row of cols = " + std::to_string(cols));
}

}  // namespace

KILN_VULKAN_KERNEL("softmax_forward", {run_softmax, softmax_supports});
KILN_VULKAN_KERNEL("softmax_backward", {run_softmax, softmax_supports});

}  // namespace kiln::vulkan
