// Dropout forward and backward share one kernel: the mask is recomputed from (seed, counter, index).
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_dropout(Encoder& e, const OpCall& c) {
  const auto& a = std::get<DropoutAttrs>(c.attrs);
  struct {
    uint32_t count;
    float rate;
    uint32_t seed, counter;
  } p{u32(a.count), a.rate, a.seed, a.counter};
  e.dispatch("dropout", {rd(c.in[0]), wr(c.out[0])}, p, e.groups_for(a.count));
}

}  // namespace kiln::vulkan
