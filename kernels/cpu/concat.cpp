// Concatenation along the middle axis of (outer, sizes, inner) and its inverse, split: contiguous runs copied whole.
#include <cstring>
#include <vector>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {
// Copies between the whole y(outer, sum sizes, inner) and its parts x_j(outer, sizes[j], inner).
template <bool kConcat>
void concat_split(const ConcatAttrs& a, float* const* parts, float* whole, ThreadPool& pool) {
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  parallel_ranges(pool, a.outer, parts_for(a.outer * total * a.inner, pool), [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      int64_t start = 0;
      for (size_t j = 0; j < a.sizes.size(); ++j) {
        const int64_t len = a.sizes[j] * a.inner;
        float* w = whole + (o * total + start) * a.inner;
        float* p = parts[j] + o * len;
        if (len > 0) std::memcpy(kConcat ? w : p, kConcat ? p : w, static_cast<size_t>(len) * sizeof(float));
        start += a.sizes[j];
      }
    }
  });
}

void concat(const ConcatAttrs& a, const float* const* xs, float* y, ThreadPool& pool) {
  concat_split<true>(a, const_cast<float* const*>(xs), y, pool);  // parts are only read
}

void split(const ConcatAttrs& a, const float* y, float* const* xs, ThreadPool& pool) {
  concat_split<false>(a, xs, const_cast<float*>(y), pool);  // the whole is only read
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("concat", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<ConcatAttrs>(c);
                  std::vector<float*>& parts = d.part_ptrs(a.sizes.size());
                  for (size_t j = 0; j < a.sizes.size(); ++j) parts[j] = const_cast<float*>(in(c, j));
                  cpu::concat(a, parts.data(), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("split", {[](CpuDevice& d, const OpCall& c) {
                  const auto& a = attrs<ConcatAttrs>(c);
                  std::vector<float*>& parts = d.part_ptrs(a.sizes.size());
                  for (size_t j = 0; j < a.sizes.size(); ++j) parts[j] = out(c, j);
                  cpu::split(a, in(c, 0), parts.data(), d.pool());
                }});

}  // namespace kiln::cpu
