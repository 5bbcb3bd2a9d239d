// Bias add and its gradient, a per-channel sum, in a fixed order (the fused max-pool backward computes the same sums:
// bias.hpp). x, y, dy and db in float32 or bf16 in any mix (float32 arithmetic, tiles staged as bf16_io.hpp says).
// y may alias x element for element (ops.hpp): each tile is read before it is written.
#include "bias.hpp"

#include <algorithm>
#include <type_traits>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

// 32 running sums (four vectors' worth: one vector's adds wait on each other, four overlap), then the rest, then
// the 32 in a fixed order: the result depends on count only, not on threads or alignment. Planes are short (196
// values for a 14x14 image), so the sums live in registers, not in an array zeroed per call. bf16 planes are widened
// in registers: the same adds in the same order as on their float32 copies.
template <class T>
float plane_sum_t(const T* p, int64_t count) {
#ifdef __AVX2__
  const auto ld = [p](int64_t i) -> __m256 {
    if constexpr (std::is_same_v<T, float>)
      return _mm256_loadu_ps(p + i);
    else
      return load8(p + i);
  };
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    a0 = _mm256_add_ps(a0, ld(i));
    a1 = _mm256_add_ps(a1, ld(i + 8));
    a2 = _mm256_add_ps(a2, ld(i + 16));
    a3 = _mm256_add_ps(a3, ld(i + 24));
  }
  if (i + 8 <= count) a0 = _mm256_add_ps(a0, ld(i)), i += 8;
  if (i + 8 <= count) a1 = _mm256_add_ps(a1, ld(i)), i += 8;
  if (i + 8 <= count) a2 = _mm256_add_ps(a2, ld(i)), i += 8;
  const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; i < count; ++i) s += to_f32(p[i]);
  return s;
#else
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= count; i += 32)
#pragma omp simd
    for (int j = 0; j < 32; ++j) acc[j] += to_f32(p[i + j]);
  for (int j = 0; i < count; ++i, ++j) acc[j] += to_f32(p[i]);
  for (int w = 16; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
#endif
}

// A dense layer's bias on bf16 activations (float32 bias), converting in registers (bf16_io.hpp's load8 and
// store8_as) instead of staging tiles: x + b in float32, rounded once, the staged path's bits.
template <bool kCvt>
void bias_add_rows_bf16(const bf16* x, const float* b, bf16* y, int64_t ob, int64_t oe, int64_t C) {
  for (int64_t o = ob; o < oe; ++o) {
    const bf16* xr = x + o * C;
    bf16* yr = y + o * C;
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) store8_as<kCvt>(yr + c, load8(xr + c) + load8(b + c));
    if (c < C) store8_n(yr + c, load8_n(xr + c, C - c) + load8_n(b + c, C - c), C - c);
  }
}

template <class X, class B, class Y>
void bias_add(const BiasAttrs& a, const X* x, const B* b, Y* y, ThreadPool& pool) {
  const int64_t C = a.channels, I = a.inner;
  const int64_t t = parts_for(a.outer * C * I, pool);
  if constexpr (std::is_same_v<X, bf16> && std::is_same_v<B, float> && std::is_same_v<Y, bf16>) {
    if (I == 1) {
      with_bf16_cvt([&](auto cvt) {
        parallel_ranges(pool, a.outer, t,
                        [&](int64_t ob, int64_t oe) { bias_add_rows_bf16<decltype(cvt)::value>(x, b, y, ob, oe, C); });
      });
      return;
    }
  }
  if (I == 1) {  // dense: (outer, channels)
    parallel_ranges(pool, a.outer, t, [&](int64_t ob, int64_t oe) {
      alignas(64) float bx[kTile], bb[kTile], by[kTile];
      for (int64_t c0 = 0; c0 < C; c0 += kTile) {  // bias tile converted once for all rows
        const int64_t n = std::min(kTile, C - c0);
        const float* bs = f32_in(b + c0, n, bb);
        for (int64_t o = ob; o < oe; ++o) {
          const float* xs = f32_in(x + o * C + c0, n, bx);
          float* ys = f32_out(y + o * C + c0, by);
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) ys[c] = xs[c] + bs[c];
          f32_commit(ys, y + o * C + c0, n);
        }
      }
    });
    return;
  }
  parallel_ranges(pool, a.outer * C, t, [&](int64_t pb, int64_t pe) {
    alignas(64) float bx[kTile], by[kTile];
    for (int64_t oc = pb; oc < pe; ++oc) {  // one (o, c) plane of `inner` elements
      const float bc = to_f32(b[oc % C]);
      for (int64_t i0 = 0; i0 < I; i0 += kTile) {
        const int64_t n = std::min(kTile, I - i0);
        const float* xp = f32_in(x + oc * I + i0, n, bx);
        float* yp = f32_out(y + oc * I + i0, by);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] + bc;
        f32_commit(yp, y + oc * I + i0, n);
      }
    }
  });
}

template <class D, class B>
void bias_grad(const BiasAttrs& a, const D* dy, B* db, ThreadPool& pool) {
  const int64_t C = a.channels, I = a.inner, O = a.outer;
  const int64_t t = parts_for(O * C * I, pool);
  if (I == 1) {  // column sums of an (outer, channels) matrix, in column blocks
    constexpr int64_t kBlock = 64;
    parallel_ranges(pool, (C + kBlock - 1) / kBlock, t, [&](int64_t bb, int64_t be) {
      alignas(64) float row_buf[kBlock];
      for (int64_t bl = bb; bl < be; ++bl) {
        const int64_t c0 = bl * kBlock, c1 = std::min(C, c0 + kBlock);
        float acc[kBlock] = {};
        if constexpr (std::is_same_v<D, bf16>) {
          // Each column's rows added in order, as below, with the bf16 rows widened in registers.
          v8f va[kBlock / 8] = {};
          const int64_t w = c1 - c0, full = w / 8 * 8;
          for (int64_t o = 0; o < O; ++o) {
            const bf16* row = dy + o * C + c0;
            for (int64_t k = 0; k < full; k += 8) va[k / 8] += load8(row + k);
            if (full < w) va[full / 8] += load8_n(row + full, w - full);
          }
          for (int64_t k = 0; k < w; ++k) acc[k] = va[k / 8][k % 8];
        } else {
          for (int64_t o = 0; o < O; ++o) {
            const float* row = f32_in(dy + o * C + c0, c1 - c0, row_buf);
#pragma omp simd
            for (int64_t c = 0; c < c1 - c0; ++c) acc[c] += row[c];
          }
        }
        for (int64_t c = c0; c < c1; ++c) db[c] = from_f32<B>(acc[c - c0]);
      }
    });
    return;
  }
  parallel_ranges(pool, C, t, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      double total = 0;
      for (int64_t o = 0; o < O; ++o) total += plane_sum_t(dy + (o * C + c) * I, I);
      db[c] = from_f32<B>(static_cast<float>(total));
    }
  });
}

}  // namespace

float bias_plane_sum(const float* p, int64_t count) { return plane_sum_t(p, count); }
float bias_plane_sum(const uint16_t* p, int64_t count) { return plane_sum_t(reinterpret_cast<const bf16*>(p), count); }

void bias_grad_from_plane_sums(const BiasAttrs& a, const float* sums, float* db) {
  const int64_t C = a.channels, O = a.outer;
  for (int64_t c = 0; c < C; ++c) {
    double total = 0;
    for (int64_t o = 0; o < O; ++o) total += sums[o * C + c];
    db[c] = static_cast<float>(total);
  }
}

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("bias_add", {[](CpuDevice& d, const OpCall& c) {
                               with_type(c.in[0].dtype, [&](auto x) {
                                 with_type(c.in[1].dtype, [&](auto b) {
                                   with_type(c.out[0].dtype, [&](auto y) {
                                     cpu::bias_add(attrs<BiasAttrs>(c), buf_as<const decltype(x)>(c.in[0]),
                                                   buf_as<const decltype(b)>(c.in[1]), buf_as<decltype(y)>(c.out[0]),
                                                   d.pool());
                                   });
                                 });
                               });
                             },
                             nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("bias_grad", {[](CpuDevice& d, const OpCall& c) {
                                with_type(c.in[0].dtype, [&](auto dy) {
                                  with_type(c.out[0].dtype, [&](auto db) {
                                    cpu::bias_grad(attrs<BiasAttrs>(c), buf_as<const decltype(dy)>(c.in[0]),
                                                   buf_as<decltype(db)>(c.out[0]), d.pool());
                                  });
                                });
                              },
                              nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
