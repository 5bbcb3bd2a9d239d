// bf16 loads and stores for the convolution side's kernels (pool.cpp, batch_norm.cpp): bf16 storage, float32
// arithmetic. Written so that loops over them vectorize (no branch on the value: the NaN case is a select), and
// rounding to nearest even with NaN kept quiet, bit for bit kiln/half.hpp's float_to_bf16.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KILN_BF16_NARROW8 1
#endif

namespace kiln::cpu::bf16io {

inline float load(float v) { return v; }
inline float load(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = to_bf16(v); }

// n values between bf16 storage and float32.
inline void widen(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}
// GCC does not vectorize to_bf16's 32-to-16-bit store on AVX2 (measured: 1.25 ns a value, against 0.25 for widen),
// so the 8-lane version is written out: the same rounding and NaN rule, then a saturating pack (every lane already
// fits in 16 bits) and a cross-lane permute to put the 8 results in order. Where the CPU has AVX512_BF16 (with VL),
// vcvtneps2bf16 rounds 8 floats in one instruction to the same bits, but flushes subnormal inputs: a vector holding
// one takes the integer rounding (inline asm, so the file stays an AVX2 build). narrow8 carries the avx2 target
// itself, so a portable build's AVX2 paths chosen at run time (blocked16.cpp) call it too.
#ifdef KILN_BF16_NARROW8
inline bool has_bf16_cvt8() {
  static const bool on = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
  return on;
}
// AVX-512 F/BW/VL/DQ with AVX512_BF16: the kernels' 16-value forms (round16_avx512 below) run where this is true.
inline bool has_avx512_bf16() {
  static const bool on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512bf16");
  return on;
}
__attribute__((target("avx2"))) inline __m128i narrow8(__m256 x, bool cvt) {
  const __m256i u = _mm256_castps_si256(x);
  if (cvt) {
    // No lane subnormal: with a = |x|'s bits, a lane is subnormal where a - 0x800000 < 0 <= a - 1.
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    if (_mm256_testc_ps(_mm256_castsi256_ps(_mm256_sub_epi32(a, _mm256_set1_epi32(1))),
                        _mm256_castsi256_ps(_mm256_sub_epi32(a, _mm256_set1_epi32(0x800000))))) {
      __m128i r;
      asm("vcvtneps2bf16y %1, %0" : "=x"(r) : "x"(x));
      return r;
    }
  }
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8));
}
// 16 floats rounded as to_bf16 (integer rounding, NaN kept quiet: subnormals too, which vcvtneps2bf16 flushes), for
// AVX-512 code chosen at run time (cast.cpp, blocked16.cpp). (GCC 12 warns that its own AVX-512 intrinsics'
// _mm512_undefined_* values may be used uninitialized, GCC bug 105593, fixed in GCC 13: a false positive.)
#ifndef __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw"))) inline __m256i narrow16_avx512(__m512 x) {
  const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
// The same bits where the CPU has AVX512_BF16: vcvtneps2bf16, unless a lane is subnormal (fpclass 0x20), which it
// would flush to zero; then narrow16_avx512.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) inline __m256i round16_avx512(__m512 x) {
  if (_mm512_fpclass_ps_mask(x, 0x20) == 0) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  return narrow16_avx512(x);
}
#ifndef __clang__
#pragma GCC diagnostic pop
#endif
#endif
inline void narrow(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#ifdef __AVX2__
  const bool cvt = has_bf16_cvt8();
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), narrow8(_mm256_loadu_ps(src + i), cvt));
#endif
  for (; i < n; ++i) dst[i] = to_bf16(src[i]);
}

// dst[i] = f(i) for i in [0, n): directly into float32, through a float32 chunk and narrow() into bf16 (a loop of
// per-value bf16 stores does not vectorize).
template <class T, class F>
inline void store_all(T* dst, int64_t n, F f) {
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = f(i);
  } else {
    constexpr int64_t kChunk = 512;
    float tmp[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) tmp[j] = f(i0 + j);
      narrow(tmp, dst + i0, m);
    }
  }
}

}  // namespace kiln::cpu::bf16io
