// Dropout's mask from a counter-based hash (kiln::dropout_uniform), so forward and backward draw the same mask
// without storing it. y may alias x element for element (ops.hpp), which `omp simd` loops allow.
#include <cstdint>

#include "cpu_kernel.hpp"
#include "kiln/reference.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

// Same bits as kiln::dropout_uniform, with the per-call part of the hash hoisted out of the loop.
void dropout(const DropoutAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const uint32_t base = kiln_hash32(a.counter ^ kiln_hash32(a.seed));
  const float rate = a.rate, keep_div = 1.0f - a.rate;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const uint32_t h = kiln_hash32(static_cast<uint32_t>(i) ^ base);
      const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
      const float kept = x[i] / keep_div;  // computed unconditionally so the select vectorizes
      y[i] = u >= rate ? kept : 0.f;
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

// Forward and backward are the same mask applied to x or dy.
KILN_CPU_KERNEL("dropout_forward", {[](CpuDevice& d, const OpCall& c) {
                  cpu::dropout(attrs<DropoutAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("dropout_backward", {[](CpuDevice& d, const OpCall& c) {
                  cpu::dropout(attrs<DropoutAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
