// Embedding lookup and its gradient. The gradient runs one invocation per table element over the rows in order
// (deterministic, no float atomics); rows and elements are split over dispatches (later row ranges accumulate).
#include <algorithm>
#include <string>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_embedding(Encoder& e, const OpCall& c) {
  const auto& a = std::get<EmbeddingAttrs>(c.attrs);
  if (c.kind == OpKind::EmbeddingForward) {
    struct {
      uint32_t rows, vocab, dim;
    } p{u32(a.rows), u32(a.vocab), u32(a.dim)};
    e.dispatch("embedding_forward", {rd(c.in[0]), rd(c.in[1]), wr(c.out[0])}, p, e.groups_for(a.rows * a.dim));
    return;
  }
  // Ranges of table elements and of rows within the loop budget (kernel_support.hpp); later row ranges accumulate.
  const int64_t outputs = a.vocab * a.dim;
  if (outputs == 0) return;
  const int64_t groups = e.groups_for(outputs);
  const LoopSplit sp = split_loops((outputs + groups * 256 - 1) / (groups * 256), a.rows, 0);
  const int64_t ospan = groups * 256 * sp.outer;
  for (int64_t o0 = 0; o0 < outputs; o0 += ospan) {
    const int64_t o1 = std::min(outputs, o0 + ospan);
    int64_t r0 = 0;
    do {
      const int64_t r1 = std::min(a.rows, r0 + sp.inner);
      struct {
        uint32_t vocab, dim, r0, r1, accumulate, o0, o1;
      } p{u32(a.vocab), u32(a.dim), u32(r0), u32(r1), r0 > 0, u32(o0), u32(o1)};
      e.dispatch("embedding_backward", {rd(c.in[0]), rd(c.in[1]), r0 > 0 ? rw(c.out[0]) : wr(c.out[0])}, p,
                 e.groups_for(o1 - o0));
      r0 = r1;
    } while (r0 < a.rows);
  }
}

Support embedding_supports(OpKind, const OpAttrs& attrs, const DeviceLimits&) {
  const auto& a = std::get<EmbeddingAttrs>(attrs);
  if (a.vocab >= (int64_t(1) << 24))  // ids are compared as floats, exact only below 2^24
    return no("vocab = " + std::to_string(a.vocab) + " exceeds 2^24, the largest id a float holds exactly");
  return {};
}

}  // namespace

KILN_VULKAN_KERNEL("embedding_forward", {run_embedding, embedding_supports});
KILN_VULKAN_KERNEL("embedding_backward", {run_embedding, embedding_supports});

}  // namespace kiln::vulkan
