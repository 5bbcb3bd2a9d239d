// bf16 storage for the CPU kernels that compute in float32: vector loads and stores (8 values, the width of
// vec_math.hpp's v8f) and the tile staging most kernels use. A kernel templated on its tensors' element type T
// (float or bf16) reads a tile of at most kTile values through f32_in (the storage itself for float, a converted
// copy on the stack for bf16), computes into f32_out's buffer and writes it back with f32_commit; for float these
// are the pointers themselves and no copy is made. A tile stays in L1, so a bf16 tensor costs its 2 bytes a value
// in memory traffic, which is what the memory-bound ops gain from (a whole-tensor conversion in the backend costs
// 2 + 4 + 4 bytes more per value). Rounding is to nearest even with NaN kept, as kiln/half.hpp's float_to_bf16.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/device.hpp"
#include "kiln/half.hpp"
#include "vec_math.hpp"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace kiln::cpu {

// One bf16 value as stored (the high half of a float32); a type of its own so templates tell it from float.
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_float(x.bits); }
template <class T>
inline T from_f32(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else
    return bf16{float_to_bf16(f)};
}

inline v8f load8(const bf16* p) {
#ifdef __AVX2__
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return std::bit_cast<v8f>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  v8u u;
  for (int i = 0; i < 8; ++i) u[i] = static_cast<uint32_t>(p[i].bits) << 16;
  return std::bit_cast<v8f>(u);
#endif
}

inline void store8(bf16* p, v8f v) {
  const v8u u = std::bit_cast<v8u>(v);
  v8u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  r = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r;  // NaN stays a quiet NaN
#ifdef __AVX2__
  const __m256i ri = std::bit_cast<__m256i>(r);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(ri), _mm256_extracti128_si256(ri, 1)));
#else
  for (int i = 0; i < 8; ++i) p[i].bits = static_cast<uint16_t>(r[i]);
#endif
}

// n values between bf16 storage and float32.
inline void bf16_to_f32(const bf16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(d + i, load8(s + i));
  for (; i < n; ++i) d[i] = to_f32(s[i]);
}
inline void f32_to_bf16(const float* s, bf16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(d + i, load8(s + i));
  for (; i < n; ++i) d[i] = from_f32<bf16>(s[i]);
}

// Tile staging (see the top of the file). A kernel's loop over [b, e) becomes a loop over tiles of kTile values.
inline constexpr int64_t kTile = 512;
template <class T>
inline const float* f32_in(const T* p, int64_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)n, (void)buf;
    return p;
  } else {
    bf16_to_f32(p, buf, n);
    return buf;
  }
}
template <class T>
inline float* f32_out(T* p, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    return p;
  } else {
    return buf;
  }
}
template <class T>
inline void f32_commit(const float* s, T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (s != p && n > 0) std::memcpy(p, s, static_cast<size_t>(n) * sizeof(float));
  } else {
    f32_to_bf16(s, p, n);
  }
}

// A bound buffer's storage as T (null when unbound).
template <class T>
inline T* buf_as(const BufferView& v) {
  return v.block ? static_cast<T*>(v.raw()) : nullptr;
}

// Calls f(float{}) or f(bf16{}) for a storage type the kernels read natively: f32 or bf16 (never f16).
template <class F>
inline void with_type(DType t, F&& f) {
  if (t == DType::bf16)
    f(bf16{});
  else
    f(float{});
}
inline bool f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }
// takes_types for a kernel templated on every buffer's type: any mix of float32 and bf16.
inline bool all_f32_or_bf16(const OpCall& c) {
  for (const auto& v : c.in)
    if (!f32_or_bf16(v.dtype)) return false;
  for (const auto& v : c.out)
    if (!f32_or_bf16(v.dtype)) return false;
  return true;
}

}  // namespace kiln::cpu
