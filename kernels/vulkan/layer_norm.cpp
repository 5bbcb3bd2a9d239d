// Layer norm forward (one workgroup per row), its input gradient (one workgroup per row) and its parameter
// gradients (one invocation per column, rows in order), each split into dispatches within the loop budget.
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

// Counted loop iterations per row of the layer norm kernels (64 invocations per row): forward three walks of
// the row and two tree sums; backward (dx) two walks and two tree sums.
int64_t layer_norm_row_cost(OpKind kind, int64_t cols) {
  const int64_t steps = (cols + 63) / 64;
  return kind == OpKind::LayerNormBackward ? 2 * steps + 12 + 1 : 3 * steps + 12 + 1;
}

void run_layer_norm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<LayerNormAttrs>(c.attrs);
  if (a.rows == 0) return;
  const int64_t groups = e.groups_for(a.rows, 1);
  const int64_t rspan =
      groups * split_loops((a.rows + groups - 1) / groups, layer_norm_row_cost(c.kind, a.cols), 0).outer;
  if (c.kind == OpKind::LayerNormForward) {
    for (int64_t r0 = 0; r0 < a.rows; r0 += rspan) {
      const int64_t r1 = std::min(a.rows, r0 + rspan);
      struct {
        uint32_t rows, cols, r0, r1;
        float eps;
        uint32_t has_bias;
      } p{u32(a.rows), u32(a.cols), u32(r0), u32(r1), a.eps, a.bias ? 1u : 0u};
      e.dispatch(
          "layer_norm_forward",
          {rd(c.in[0]), rd(c.in[1]), a.bias ? rd(c.in[2]) : unused(c.in[1]), wr(c.out[0]), wr(c.out[1]), wr(c.out[2])},
          p, e.groups_for(r1 - r0, 1));
    }
    return;
  }
  if (a.cols == 0) return;
  for (int64_t r0 = 0; r0 < a.rows; r0 += rspan) {
    const int64_t r1 = std::min(a.rows, r0 + rspan);
    struct {
      uint32_t rows, cols, r0, r1;
    } p{u32(a.rows), u32(a.cols), u32(r0), u32(r1)};
    e.dispatch("layer_norm_backward", {rd(c.in[0]), rd(c.in[1]), rd(c.in[2]), rd(c.in[3]), rd(c.in[4]), wr(c.out[0])},
               p, e.groups_for(r1 - r0, 1));
  }
  // Parameter gradients: columns over invocations, rows in order; later row ranges accumulate.
  const int64_t cgroups = e.groups_for(a.cols);
  const LoopSplit sp = split_loops((a.cols + cgroups * 256 - 1) / (cgroups * 256), a.rows, 0);
  const int64_t cspan = cgroups * 256 * sp.outer;
  for (int64_t c0 = 0; c0 < a.cols; c0 += cspan) {
    const int64_t c1 = std::min(a.cols, c0 + cspan);
    int64_t r0 = 0;
    do {
      const int64_t r1 = std::min(a.rows, r0 + sp.inner);
      struct {
        uint32_t cols, r0, r1, c0, c1, accumulate, has_bias;
      } p{u32(a.cols), u32(r0), u32(r1), u32(c0), u32(c1), r0 > 0 ? 1u : 0u, a.bias ? 1u : 0u};
      auto out = [&](const BufferView& v) { return r0 > 0 ? rw(v) : wr(v); };
      e.dispatch("layer_norm_param_grad",
                 {rd(c.in[0]), rd(c.in[2]), rd(c.in[3]), rd(c.in[4]), out(c.out[1]),
                  a.bias ? out(c.out[2]) : unused(c.out[1])},
                 p, e.groups_for(c1 - c0));
      r0 = r1;
    } while (r0 < a.rows);
  }
}

Support layer_norm_supports(OpKind kind, const OpAttrs& attrs, const DeviceLimits&) {
  const int64_t cols = std::get<LayerNormAttrs>(attrs).cols;
  return row_fits(layer_norm_row_cost(kind, cols), 0, "a row of cols = " + std::to_string(cols));
}

}  // namespace

KILN_VULKAN_KERNEL("layer_norm_forward", {run_layer_norm, layer_norm_supports});
KILN_VULKAN_KERNEL("layer_norm_backward", {run_layer_norm, layer_norm_supports});

}  // namespace kiln::vulkan
