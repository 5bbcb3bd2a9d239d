// Dropout forward and backward share one kernel: the mask is recomputed from (seed, counter, index).
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_dropout(Encoder& e, const OpCall& c) {
  const auto& a = std::get<DropoutAttrs>(c.attrs);
  struct {
    uint32_t count;
    float rate;
    uint32_t seed, counter;
  } p{u32(a.count), a.rate, a.seed, a.counter};
  e.dispatch("dropout", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.count));
}

}  // namespace

KILN_VULKAN_KERNEL("dropout_forward", {run_dropout});
KILN_VULKAN_KERNEL("dropout_backward", {run_dropout});

}  // namespace kiln::vulkan
