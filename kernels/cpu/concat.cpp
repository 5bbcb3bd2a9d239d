// Concatenation along the middle axis of (outer, sizes, inner) and its inverse, split: contiguous runs copied whole,
// of any storage type (bytes moved as they are) when every buffer holds the same one.
#include <cstring>
#include <vector>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {
// Copies between the whole y(outer, sum sizes, inner) and its parts x_j(outer, sizes[j], inner).
template <bool kConcat>
void concat_split(const ConcatAttrs& a, float* const* parts, char* whole, size_t esize, ThreadPool& pool) {
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  parallel_ranges(pool, a.outer, parts_for(a.outer * total * a.inner, pool), [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      int64_t start = 0;
      for (size_t j = 0; j < a.sizes.size(); ++j) {
        const int64_t len = a.sizes[j] * a.inner;
        char* w = whole + static_cast<size_t>((o * total + start) * a.inner) * esize;
        char* p = reinterpret_cast<char*>(parts[j]) + static_cast<size_t>(o * len) * esize;
        if (len > 0) std::memcpy(kConcat ? w : p, kConcat ? p : w, static_cast<size_t>(len) * esize);
        start += a.sizes[j];
      }
    }
  });
}

bool same_types(const OpCall& c) {
  for (const auto& v : c.in)
    if (v.dtype != c.out[0].dtype) return false;
  for (const auto& v : c.out)
    if (v.dtype != c.out[0].dtype) return false;
  return true;
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

// part_ptrs holds the parts' addresses (as float pointers, whatever they hold).
KILN_CPU_KERNEL("concat", {[](CpuDevice& d, const OpCall& c) {
                             const auto& a = attrs<ConcatAttrs>(c);
                             std::vector<float*>& parts = d.part_ptrs(a.sizes.size());
                             for (size_t j = 0; j < a.sizes.size(); ++j)
                               parts[j] = c.in[j].block ? static_cast<float*>(c.in[j].raw()) : nullptr;
                             concat_split<true>(a, parts.data(), static_cast<char*>(c.out[0].raw()),
                                                dtype_size(c.out[0].dtype), d.pool());
                           },
                           nullptr, nullptr, same_types});
KILN_CPU_KERNEL("split", {[](CpuDevice& d, const OpCall& c) {
                            const auto& a = attrs<ConcatAttrs>(c);
                            std::vector<float*>& parts = d.part_ptrs(a.sizes.size());
                            for (size_t j = 0; j < a.sizes.size(); ++j)
                              parts[j] = c.out[j].block ? static_cast<float*>(c.out[j].raw()) : nullptr;
                            concat_split<false>(a, parts.data(), static_cast<char*>(c.in[0].raw()),
                                                dtype_size(c.in[0].dtype), d.pool());
                          },
                          nullptr, nullptr, same_types});

}  // namespace kiln::cpu
