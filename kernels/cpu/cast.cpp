// Cast between float32 and the 16-bit storage types (bf16, f16), rounding to nearest even as kiln/half.hpp does.
#include <cstring>

#include "cpu_kernel.hpp"
#include "kiln/half.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void cast(const CastAttrs& a, const void* x, void* y, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (e <= b) return;
    const auto n = static_cast<size_t>(e - b);
    if (a.from == a.to) {
      std::memcpy(static_cast<char*>(y) + b * static_cast<int64_t>(dtype_size(a.to)),
                  static_cast<const char*>(x) + b * static_cast<int64_t>(dtype_size(a.from)), n * dtype_size(a.to));
    } else if (a.from == DType::f32) {
      from_float(static_cast<const float*>(x) + b, static_cast<uint16_t*>(y) + b, a.to, n);
    } else if (a.to == DType::f32) {
      to_float(static_cast<const uint16_t*>(x) + b, a.from, static_cast<float*>(y) + b, n);
    } else {  // bf16 <-> f16 through float32 (exact: float32 holds both)
      const auto* s = static_cast<const uint16_t*>(x) + b;
      auto* d = static_cast<uint16_t*>(y) + b;
      for (size_t i = 0; i < n; ++i) d[i] = float_to_half(half_to_float(s[i], a.from), a.to);
    }
  });
}

}  // namespace

KILN_CPU_KERNEL("cast", {[](CpuDevice& d, const OpCall& c) {
                           cast(attrs<CastAttrs>(c), c.in[0].raw(), c.out[0].raw(), d.pool());
                         },
                         nullptr, nullptr, [](const OpCall&) { return true; }});

}  // namespace kiln::cpu
