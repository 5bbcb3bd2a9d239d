// Row kernels on bf16 storage shared by a kernel file and the tests that compare their code paths: softmax's
// backward row, in the AVX2 form every x86-64-v3 CPU runs and an AVX-512 form (16 values a vector, AVX512_BF16's
// rounding) chosen at run time where the CPU has AVX512F/BW/VL/DQ and AVX512_BF16. Both give the same bits: the
// AVX-512 form adds the same products into the same float32 accumulators in the same order (its even and odd
// accumulators are the AVX2 form's a0 | a2 and a1 | a3 side by side), computes each output element by the same two
// operations, and rounds exactly as float_to_bf16 (a vector holding a subnormal takes the integer rounding, since
// vcvtneps2bf16 flushes those); tests/unit/test_cpu_bf16_io.cpp checks it.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "bf16_io.hpp"

namespace kiln::cpu {

// dx = y (dy - <dy, y>) on float32 or bf16 storage converted in registers. The dot product runs in its own order
// (even and odd elements apart where both inputs are bf16, load16_eo; else sum8_by4's), not the float32 kernel's.
// Products are added with explicit fused multiply-adds so the AVX-512 form can repeat them exactly.
// <dy, y> for bf16 rows: even and odd elements apart (load16_eo) in four accumulators, then a tree, then the
// tail; products added with explicit fused multiply-adds so the AVX-512 form can repeat them exactly.
inline float dot_bf16(const bf16* y, const bf16* dy, int64_t cols) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, ye, yo, de, dd;
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) {
    load16_eo(y + j, &ye, &yo);
    load16_eo(dy + j, &de, &dd);
    a0 = fma8(de, ye, a0);
    a1 = fma8(dd, yo, a1);
    load16_eo(y + j + 16, &ye, &yo);
    load16_eo(dy + j + 16, &de, &dd);
    a2 = fma8(de, ye, a2);
    a3 = fma8(dd, yo, a3);
  }
  for (; j + 16 <= cols; j += 16) {
    load16_eo(y + j, &ye, &yo);
    load16_eo(dy + j, &de, &dd);
    a0 = fma8(de, ye, a0);
    a1 = fma8(dd, yo, a1);
  }
  float dot = hsum8_tree((a0 + a1) + (a2 + a3));
  for (; j < cols; ++j) dot = std::fma(to_f32(dy[j]), to_f32(y[j]), dot);
  return dot;
}

// dx = y (dy - <dy, y>) on float32 or bf16 storage converted in registers. The dot product runs in its own order
// (dot_bf16's where both inputs are bf16, else sum8_by4's), not the float32 kernel's.
template <bool kCvt, class Y, class D, class X>
inline void softmax_backward_row_io(const Y* y, const D* dy, X* dx, int64_t cols) {
  float dot;
  if constexpr (std::is_same_v<Y, bf16> && std::is_same_v<D, bf16>) {
    dot = dot_bf16(y, dy, cols);
  } else {
    const int64_t c8 = cols / 8 * 8;
    dot = sum8_by4(c8, [y, dy](int64_t k) { return load8(dy + k) * load8(y + k); });
    for (int64_t j = c8; j < cols; ++j) dot += to_f32(dy[j]) * to_f32(y[j]);
  }
  map8_io2<kCvt>(y, dy, dx, cols, [dot](v8f yv, v8f dv) { return yv * (dv - dot); });
}

#if defined(__AVX2__) && defined(__GNUC__) && defined(__x86_64__)
#define KILN_CPU_AVX512_ROWS 1
inline bool has_avx512_rows() {
  static const bool on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512bf16");
  return on;
}

#define KILN_AVX512_ROWS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// (GCC 12 warns that its own AVX-512 intrinsics' _mm512_undefined_* values are or may be used uninitialized, GCC
// bug 105593, fixed in GCC 13: a false positive.)
#ifndef __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// 16 products' worth of the even/odd split of load16_eo at 512 bits: 32 bf16 values.
KILN_AVX512_ROWS_TARGET inline void load32_eo(const bf16* p, __m512* even, __m512* odd) {
  const __m512i v = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
KILN_AVX512_ROWS_TARGET inline __m512 load16_avx512(const bf16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// 16 values rounded as float_to_bf16: vcvtneps2bf16 unless a lane is subnormal (fpclass 0x20), then store8 twice.
KILN_AVX512_ROWS_TARGET inline void store16_avx512(bf16* p, __m512 v) {
  if (_mm512_fpclass_ps_mask(v, 0x20) == 0) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), std::bit_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  } else {
    store8(p, std::bit_cast<v8f>(_mm512_castps512_ps256(v)));
    store8(p + 8, std::bit_cast<v8f>(_mm512_extractf32x8_ps(v, 1)));
  }
}

// dot_bf16 with 512-bit vectors: e holds dot_bf16's a0 | a2, o its a1 | a3, lane for lane; the same bits.
KILN_AVX512_ROWS_TARGET inline float dot_bf16_avx512(const bf16* y, const bf16* dy, int64_t cols) {
  __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps(), ye, yo, de, dd;
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) {
    load32_eo(y + j, &ye, &yo);
    load32_eo(dy + j, &de, &dd);
    e = _mm512_fmadd_ps(de, ye, e);
    o = _mm512_fmadd_ps(dd, yo, o);
  }
  v8f a0 = std::bit_cast<v8f>(_mm512_castps512_ps256(e)), a2 = std::bit_cast<v8f>(_mm512_extractf32x8_ps(e, 1));
  v8f a1 = std::bit_cast<v8f>(_mm512_castps512_ps256(o)), a3 = std::bit_cast<v8f>(_mm512_extractf32x8_ps(o, 1));
  for (; j + 16 <= cols; j += 16) {
    v8f ye8, yo8, de8, dd8;
    load16_eo(y + j, &ye8, &yo8);
    load16_eo(dy + j, &de8, &dd8);
    a0 = fma8(de8, ye8, a0);
    a1 = fma8(dd8, yo8, a1);
  }
  float dot = hsum8_tree((a0 + a1) + (a2 + a3));
  for (; j < cols; ++j) dot = std::fma(to_f32(dy[j]), to_f32(y[j]), dot);
  return dot;
}

// softmax_backward_row_io<true, bf16, bf16, bf16> with 512-bit vectors; the same bits.
KILN_AVX512_ROWS_TARGET inline void softmax_backward_row_avx512(const bf16* y, const bf16* dy, bf16* dx, int64_t cols) {
  const float dot = dot_bf16_avx512(y, dy, cols);
  const __m512 d16 = _mm512_set1_ps(dot);
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16)
    store16_avx512(dx + i, _mm512_mul_ps(load16_avx512(y + i), _mm512_sub_ps(load16_avx512(dy + i), d16)));
  map8_io2<true>(y + i, dy + i, dx + i, cols - i, [dot](v8f yv, v8f dv) { return yv * (dv - dot); });
}
#ifndef __clang__
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace kiln::cpu
