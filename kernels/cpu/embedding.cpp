// Embedding lookup (gather rows) and its gradient (scatter-add rows). The gradient is split over the embedding
// dimension, so every thread adds its columns of every row in order: deterministic, no atomics.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

int64_t row_of(float id, int64_t vocab) {
  if (!(id >= 0.f) || id != std::floor(id) || id >= static_cast<float>(vocab)) return -1;
  return static_cast<int64_t>(id);
}

// y (forward) and dy (backward) float32 or bf16; ids, the table and its gradient float32.
template <class Y>
void embedding_forward(const EmbeddingAttrs& a, const float* ids, const float* table, Y* y, ThreadPool& pool) {
  const int64_t D = a.dim;
  parallel_ranges(pool, a.rows, parts_for(a.rows * D, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t v = row_of(ids[r], a.vocab);
      if (v >= 0) {
        f32_commit(table + v * D, y + r * D, D);
      } else {
        for (int64_t j = 0; j < D; ++j) y[r * D + j] = from_f32<Y>(std::numeric_limits<float>::quiet_NaN());
      }
    }
  });
}

template <class G>
void embedding_backward(const EmbeddingAttrs& a, const float* ids, const G* dy, float* dtable, ThreadPool& pool) {
  const int64_t D = a.dim;
  std::memset(dtable, 0, static_cast<size_t>(a.vocab * D) * sizeof(float));
  // Column ranges of at most kTile (staged per row, bf16_io.hpp); the staged pointer is shifted to global columns.
  const int64_t parts = std::max(parts_for(a.rows * D, pool), (D + kTile - 1) / kTile);
  parallel_ranges(pool, D, parts, [&](int64_t jb, int64_t je) {
    alignas(64) float buf[kTile];
    for (int64_t r = 0; r < a.rows; ++r) {
      const int64_t v = row_of(ids[r], a.vocab);
      if (v < 0) continue;
      float* dst = dtable + v * D;
      const float* src = f32_in(dy + r * D + jb, je - jb, buf) - jb;
#pragma omp simd
      for (int64_t j = jb; j < je; ++j) dst[j] += src[j];
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("embedding_forward", {[](CpuDevice& d, const OpCall& c) {
                                        with_type(c.out[0].dtype, [&](auto y) {
                                          embedding_forward(attrs<EmbeddingAttrs>(c), in(c, 0), in(c, 1),
                                                            buf_as<decltype(y)>(c.out[0]), d.pool());
                                        });
                                      },
                                      nullptr, nullptr,
                                      [](const OpCall& c) {
                                        return c.in[0].dtype == DType::f32 && c.in[1].dtype == DType::f32 &&
                                               f32_or_bf16(c.out[0].dtype);
                                      }});
KILN_CPU_KERNEL("embedding_backward", {[](CpuDevice& d, const OpCall& c) {
                                         with_type(c.in[1].dtype, [&](auto dy) {
                                           embedding_backward(attrs<EmbeddingAttrs>(c), in(c, 0),
                                                              buf_as<const decltype(dy)>(c.in[1]), out(c, 0), d.pool());
                                         });
                                       },
                                       nullptr, nullptr,
                                       [](const OpCall& c) {
                                         return c.in[0].dtype == DType::f32 && f32_or_bf16(c.in[1].dtype) &&
                                                c.out[0].dtype == DType::f32;
                                       }});

}  // namespace kiln::cpu
