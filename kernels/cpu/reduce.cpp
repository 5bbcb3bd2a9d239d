// Sum over the middle axis of (outer, reduce, inner): float lanes over short runs, double across runs.
#include <algorithm>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void reduce_sum(const ReduceAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const int64_t R = a.reduce, I = a.inner;
  const int64_t t = parts_for(a.outer * R * I, pool);
  if (I == 1) {
    parallel_ranges(pool, a.outer, t, [&](int64_t ob, int64_t oe) {
      for (int64_t o = ob; o < oe; ++o) {
        double total = 0;
        for (int64_t c = 0; c < R; c += 4096) {  // float lanes over short runs, double across runs
          const int64_t ce = std::min(R, c + 4096);
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t r = c; r < ce; ++r) s += x[o * R + r];
          total += s;
        }
        y[o] = static_cast<float>(total);
      }
    });
    return;
  }
  constexpr int64_t kBlock = 256;  // (outer, inner block) tasks so both shapes spread over the team
  const int64_t blocks = (I + kBlock - 1) / kBlock;
  parallel_ranges(pool, a.outer * blocks, t, [&](int64_t tb, int64_t te) {
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / blocks, i0 = (task % blocks) * kBlock, i1 = std::min(I, i0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t r = 0; r < R; ++r) {
        const float* row = x + (o * R + r) * I;
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) acc[i - i0] += row[i];
      }
      std::copy(acc, acc + (i1 - i0), y + o * I + i0);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("reduce_sum", {[](CpuDevice& d, const OpCall& c) {
                  cpu::reduce_sum(attrs<ReduceAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
