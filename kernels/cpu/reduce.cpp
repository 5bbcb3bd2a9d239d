// Sum over the middle axis of (outer, reduce, inner): float lanes over short runs, double across runs.
#include <algorithm>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

// x and y float32 or bf16 (runs staged through bf16_io.hpp's buffers).
template <class X, class Y>
void reduce_sum(const ReduceAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  const int64_t R = a.reduce, I = a.inner;
  const int64_t t = parts_for(a.outer * R * I, pool);
  if (I == 1) {
    parallel_ranges(pool, a.outer, t, [&](int64_t ob, int64_t oe) {
      alignas(64) float buf[kTile];
      for (int64_t o = ob; o < oe; ++o) {
        double total = 0;
        for (int64_t c = 0; c < R; c += 4096) {  // float lanes over short runs, double across runs
          const int64_t ce = std::min(R, c + 4096);
          float s = 0.f;
          if constexpr (std::is_same_v<X, float>) {
#pragma omp simd reduction(+ : s)
            for (int64_t r = c; r < ce; ++r) s += x[o * R + r];
          } else {
            for (int64_t t = c; t < ce; t += kTile) {
              const int64_t n = std::min(kTile, ce - t);
              const float* xs = f32_in(x + o * R + t, n, buf);
#pragma omp simd reduction(+ : s)
              for (int64_t r = 0; r < n; ++r) s += xs[r];
            }
          }
          total += s;
        }
        y[o] = from_f32<Y>(static_cast<float>(total));
      }
    });
    return;
  }
  constexpr int64_t kBlock = 256;  // (outer, inner block) tasks so both shapes spread over the team
  const int64_t blocks = (I + kBlock - 1) / kBlock;
  parallel_ranges(pool, a.outer * blocks, t, [&](int64_t tb, int64_t te) {
    alignas(64) float buf[kBlock];
    for (int64_t task = tb; task < te; ++task) {
      const int64_t o = task / blocks, i0 = (task % blocks) * kBlock, i1 = std::min(I, i0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t r = 0; r < R; ++r) {
        const float* row = f32_in(x + (o * R + r) * I + i0, i1 - i0, buf) - i0;
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) acc[i - i0] += row[i];
      }
      f32_commit(acc, y + o * I + i0, i1 - i0);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("reduce_sum", {[](CpuDevice& d, const OpCall& c) {
                                 with_type(c.in[0].dtype, [&](auto x) {
                                   with_type(c.out[0].dtype, [&](auto y) {
                                     cpu::reduce_sum(attrs<ReduceAttrs>(c), buf_as<const decltype(x)>(c.in[0]),
                                                     buf_as<decltype(y)>(c.out[0]), d.pool());
                                   });
                                 });
                               },
                               nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
