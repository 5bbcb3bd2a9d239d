// Row-wise softmax forward and backward: one workgroup per row with tree reductions.
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_softmax(Encoder& e, const OpCall& c) {
  const auto& a = std::get<SoftmaxAttrs>(c.attrs);
  if (a.cols == 0) return;
  struct {
    uint32_t rows, cols;
  } p{u32(a.rows), u32(a.cols)};
  if (c.kind == OpKind::SoftmaxForward)
    e.dispatch("softmax_forward", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.rows, 1));
  else
    e.dispatch("softmax_backward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(a.rows, 1));
}

}  // namespace kiln::vulkan
