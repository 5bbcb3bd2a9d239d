// Embedding lookup and its gradient. The gradient runs one invocation per table element over the rows in order
// (deterministic, no float atomics); long row ranges are split over dispatches that accumulate.
#include <algorithm>
#include <variant>

#include "vulkan_ops.hpp"

namespace kiln::vulkan {

void run_embedding(Encoder& e, const OpCall& c) {
  const auto& a = std::get<EmbeddingAttrs>(c.attrs);
  if (c.kind == OpKind::EmbeddingForward) {
    struct {
      uint32_t rows, vocab, dim;
    } p{u32(a.rows), u32(a.vocab), u32(a.dim)};
    e.dispatch("embedding_forward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(a.rows * a.dim));
    return;
  }
  int64_t r0 = 0;
  do {
    const int64_t r1 = std::min(a.rows, r0 + kMaxLoop);
    struct {
      uint32_t vocab, dim, r0, r1, accumulate;
    } p{u32(a.vocab), u32(a.dim), u32(r0), u32(r1), r0 > 0};
    e.dispatch("embedding_backward", {rd(c.in[0]), rd(c.in[1]), r0 > 0 ? rw(c.out[0]) : wr(c.out[0])}, p,
               e.groups_for(a.vocab * a.dim));
    r0 = r1;
  } while (r0 < a.rows);
}

}  // namespace kiln::vulkan
