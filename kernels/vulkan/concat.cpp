// Concat and Split: one strided copy per piece. Pieces write disjoint rows, so they need no barrier between
// them beyond what hazard tracking decides.
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {
namespace {

void run_concat(Encoder& e, const OpCall& c) {
  const auto& a = std::get<ConcatAttrs>(c.attrs);
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  int64_t start = 0;
  const bool concat = c.kind == OpKind::Concat;
  for (size_t j = 0; j < a.sizes.size(); ++j) {
    const int64_t rows = a.sizes[j];
    struct {
      uint32_t outer, rows, inner, src_rows, src_row0, dst_rows, dst_row0;
    } p{u32(a.outer), u32(rows), u32(a.inner), 0, 0, 0, 0};
    if (concat) {
      p.src_rows = u32(rows);
      p.dst_rows = u32(total);
      p.dst_row0 = u32(start);
      e.dispatch("strided_copy", {rd(c.in[j]), wr(c.out[0])}, p, e.groups_for(a.outer * rows * a.inner));
    } else {
      p.src_rows = u32(total);
      p.src_row0 = u32(start);
      p.dst_rows = u32(rows);
      e.dispatch("strided_copy", {rd(c.in[0]), wr(c.out[j])}, p, e.groups_for(a.outer * rows * a.inner));
    }
    start += rows;
  }
}

}  // namespace

KILN_VULKAN_KERNEL("concat", {run_concat});
KILN_VULKAN_KERNEL("split", {run_concat});

}  // namespace kiln::vulkan
