// Embedding lookup (gather rows) and its gradient (scatter-add rows). The gradient is split over the embedding
// dimension, so every thread adds its columns of every row in order: deterministic, no atomics.
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

int64_t row_of(float id, int64_t vocab) {
  if (!(id >= 0.f) || id != std::floor(id) || id >= static_cast<float>(vocab)) return -1;
  return static_cast<int64_t>(id);
}

void embedding_forward(const EmbeddingAttrs& a, const float* ids, const float* table, float* y, ThreadPool& pool) {
  const int64_t D = a.dim;
  parallel_ranges(pool, a.rows, parts_for(a.rows * D, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t v = row_of(ids[r], a.vocab);
      if (v >= 0) {
        std::memcpy(y + r * D, table + v * D, static_cast<size_t>(D) * sizeof(float));
      } else {
        for (int64_t j = 0; j < D; ++j) y[r * D + j] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  });
}

void embedding_backward(const EmbeddingAttrs& a, const float* ids, const float* dy, float* dtable, ThreadPool& pool) {
  const int64_t D = a.dim;
  std::memset(dtable, 0, static_cast<size_t>(a.vocab * D) * sizeof(float));
  parallel_ranges(pool, D, parts_for(a.rows * D, pool), [&](int64_t jb, int64_t je) {
    for (int64_t r = 0; r < a.rows; ++r) {
      const int64_t v = row_of(ids[r], a.vocab);
      if (v < 0) continue;
      float* dst = dtable + v * D;
      const float* src = dy + r * D;
#pragma omp simd
      for (int64_t j = jb; j < je; ++j) dst[j] += src[j];
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("embedding_forward", {[](CpuDevice& d, const OpCall& c) {
                  embedding_forward(attrs<EmbeddingAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("embedding_backward", {[](CpuDevice& d, const OpCall& c) {
                  embedding_backward(attrs<EmbeddingAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
