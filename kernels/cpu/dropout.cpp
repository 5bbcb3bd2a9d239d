// Dropout's mask from a counter-based hash (kiln::dropout_uniform), so forward and backward draw the same mask
// without storing it. y may alias x element for element (ops.hpp), which `omp simd` loops allow.
#include <algorithm>
#include <cstdint>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "kiln/reference.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

// Same bits as kiln::dropout_uniform, with the per-call part of the hash hoisted out of the loop.
// x and y float32 or bf16 (tiles staged, bf16_io.hpp).
template <class X, class Y>
void dropout(const DropoutAttrs& a, const X* x_store, Y* y_store, ThreadPool& pool) {
  const uint32_t base = kiln_hash32(a.counter ^ kiln_hash32(a.seed));
  const float rate = a.rate, keep_div = 1.0f - a.rate;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    alignas(64) float bx[kTile], by[kTile];
    for (int64_t t = b; t < e; t += kTile) {
      const int64_t n = std::min(kTile, e - t);
      const float* x = f32_in(x_store + t, n, bx);
      float* y = f32_out(y_store + t, by);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t h = kiln_hash32(static_cast<uint32_t>(t + i) ^ base);
        const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
        const float kept = x[i] / keep_div;  // computed unconditionally so the select vectorizes
        y[i] = u >= rate ? kept : 0.f;
      }
      f32_commit(y, y_store + t, n);
    }
  });
}

void run_dropout(CpuDevice& d, const OpCall& c) {
  with_type(c.in[0].dtype, [&](auto x) {
    with_type(c.out[0].dtype, [&](auto y) {
      cpu::dropout(attrs<DropoutAttrs>(c), buf_as<const decltype(x)>(c.in[0]), buf_as<decltype(y)>(c.out[0]), d.pool());
    });
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

// Forward and backward are the same mask applied to x or dy.
KILN_CPU_KERNEL("dropout_forward", {run_dropout, nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("dropout_backward", {run_dropout, nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
