// loss_unscale (float16's dynamic loss scaling): y = alpha * x with alpha = 1 / loss scale, patched into the call
// every step, on the elementwise_unary shader (its scale mode).
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

struct UnscaleParams {
  uint32_t count, mode;
  float alpha, beta;
};

void run_unscale(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ElementwiseAttrs>(c.attrs);
  const UnscaleParams p{u32(a.count), 1u, a.alpha, 0.f};
  e.dispatch("elementwise_unary", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.count));
}

}  // namespace

KILN_VULKAN_KERNEL("loss_unscale", {run_unscale});

}  // namespace kiln::vulkan
