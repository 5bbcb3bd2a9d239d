// Bias, elementwise arithmetic, reductions, concat/split and dropout. Outputs that ops.hpp lets alias an
// input do so element for element only, which `omp simd` loops allow.
#include <algorithm>
#include <cstring>

#include "cpu_kernel.hpp"
#include "kernels.hpp"

#ifdef __AVX2__
#include <immintrin.h>
#endif
#include "kiln/reference.hpp"

namespace kiln::cpu {

void bias_add(const BiasAttrs& a, const float* x, const float* b, float* y, ThreadPool& pool) {
  const int64_t C = a.channels, I = a.inner;
  const int64_t t = parts_for(a.outer * C * I, pool);
  if (I == 1) {  // dense: (outer, channels)
    parallel_ranges(pool, a.outer, t, [&](int64_t ob, int64_t oe) {
      for (int64_t o = ob; o < oe; ++o) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) y[o * C + c] = x[o * C + c] + b[c];
      }
    });
    return;
  }
  parallel_ranges(pool, a.outer * C, t, [&](int64_t pb, int64_t pe) {
    for (int64_t oc = pb; oc < pe; ++oc) {  // one (o, c) plane of `inner` elements
      const float bc = b[oc % C];
      const float* xp = x + oc * I;
      float* yp = y + oc * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) yp[i] = xp[i] + bc;
    }
  });
}

void bias_grad(const BiasAttrs& a, const float* dy, float* db, ThreadPool& pool) {
  const int64_t C = a.channels, I = a.inner, O = a.outer;
  const int64_t t = parts_for(O * C * I, pool);
  if (I == 1) {  // column sums of an (outer, channels) matrix, in column blocks
    constexpr int64_t kBlock = 64;
    parallel_ranges(pool, (C + kBlock - 1) / kBlock, t, [&](int64_t bb, int64_t be) {
      for (int64_t bl = bb; bl < be; ++bl) {
        const int64_t c0 = bl * kBlock, c1 = std::min(C, c0 + kBlock);
        float acc[kBlock] = {};
        for (int64_t o = 0; o < O; ++o) {
          const float* row = dy + o * C;
#pragma omp simd
          for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
        }
        std::copy(acc, acc + (c1 - c0), db + c0);
      }
    });
    return;
  }
  parallel_ranges(pool, C, t, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      double total = 0;
      for (int64_t o = 0; o < O; ++o) total += bias_plane_sum(dy + (o * C + c) * I, I);
      db[c] = static_cast<float>(total);
    }
  });
}

// 32 running sums (four vectors' worth: one vector's adds wait on each other, four overlap), then the rest, then
// the 32 in a fixed order: the result depends on count only, not on threads or alignment. Planes are short (196
// floats for a 14x14 image), so the sums live in registers, not in an array zeroed per call.
float bias_plane_sum(const float* p, int64_t count) {
#ifdef __AVX2__
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  if (i + 8 <= count) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i)), i += 8;
  if (i + 8 <= count) a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i)), i += 8;
  if (i + 8 <= count) a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i)), i += 8;
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; i < count; ++i) s += p[i];
  return s;
#else
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= count; i += 32)
#pragma omp simd
    for (int j = 0; j < 32; ++j) acc[j] += p[i + j];
  for (int j = 0; i < count; ++i, ++j) acc[j] += p[i];
  for (int w = 16; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
#endif
}

void bias_grad_from_plane_sums(const BiasAttrs& a, const float* sums, float* db) {
  const int64_t C = a.channels, O = a.outer;
  for (int64_t c = 0; c < C; ++c) {
    double total = 0;
    for (int64_t o = 0; o < O; ++o) total += sums[o * C + c];
    db[c] = static_cast<float>(total);
  }
}

void add(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i] + be * z[i];
  });
}

void mul(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = x[i] * z[i];
  });
}

void axpby(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i] + be * y[i];
  });
}

void scale(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const float al = a.alpha;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i];
  });
}

void fill(const ElementwiseAttrs& a, float* y, ThreadPool& pool) {
  const float al = a.alpha;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) { std::fill(y + b, y + e, al); });
}

void copy(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  if (x == y) return;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (e > b) std::memcpy(y + b, x + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

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
}  // namespace

void concat(const ConcatAttrs& a, const float* const* xs, float* y, ThreadPool& pool) {
  concat_split<true>(a, const_cast<float* const*>(xs), y, pool);  // parts are only read
}

void split(const ConcatAttrs& a, const float* y, float* const* xs, ThreadPool& pool) {
  concat_split<false>(a, xs, const_cast<float*>(y), pool);  // the whole is only read
}

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

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("bias_add", {[](CpuDevice& d, const OpCall& c) {
  cpu::bias_add(attrs<BiasAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("bias_grad", {[](CpuDevice& d, const OpCall& c) {
  cpu::bias_grad(attrs<BiasAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("add", {[](CpuDevice& d, const OpCall& c) {
  cpu::add(attrs<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("mul", {[](CpuDevice& d, const OpCall& c) {
  cpu::mul(attrs<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("axpby", {[](CpuDevice& d, const OpCall& c) {
  cpu::axpby(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("scale", {[](CpuDevice& d, const OpCall& c) {
  cpu::scale(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("fill", {[](CpuDevice& d, const OpCall& c) { cpu::fill(attrs<ElementwiseAttrs>(c), out(c, 0), d.pool()); }});
KILN_CPU_KERNEL("copy", {[](CpuDevice& d, const OpCall& c) {
  cpu::copy(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("reduce_sum", {[](CpuDevice& d, const OpCall& c) {
  cpu::reduce_sum(attrs<ReduceAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
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
// Forward and backward are the same mask applied to x or dy.
KILN_CPU_KERNEL("dropout_forward", {[](CpuDevice& d, const OpCall& c) {
  cpu::dropout(attrs<DropoutAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});
KILN_CPU_KERNEL("dropout_backward", {[](CpuDevice& d, const OpCall& c) {
  cpu::dropout(attrs<DropoutAttrs>(c), in(c, 0), out(c, 0), d.pool());
}});

}  // namespace kiln::cpu
