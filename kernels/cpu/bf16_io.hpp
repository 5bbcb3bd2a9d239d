// bf16 storage for the CPU kernels that compute in float32: vector loads and stores (8 values, the width of
// vec_math.hpp's v8f) and the tile staging most kernels use. A kernel templated on its tensors' element type T
// (float or bf16) reads a tile of at most kTile values through f32_in (the storage itself for float, a converted
// copy on the stack for bf16), computes into f32_out's buffer and writes it back with f32_commit; for float these
// are the pointers themselves and no copy is made. A tile stays in L1, so a bf16 tensor costs its 2 bytes a value
// in memory traffic, which is what the memory-bound ops gain from (a whole-tensor conversion in the backend costs
// 2 + 4 + 4 bytes more per value). The row kernels (softmax, layer norm, activations) convert in the loop instead
// (map8_io, store8_as below): staging cost them more than the halved traffic saved. Rounding is to nearest even
// with NaN kept, as kiln/half.hpp's float_to_bf16, on every path (AVX512_BF16's included).
#pragma once
#include <bit>
#include <cmath>
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

// The first n (0 <= n < 8) values as a vector, the other lanes zero; and the first n lanes of v stored. Row tails
// of the kernels that convert in the loop (below); element by element so nothing past p + n is touched.
template <class T>
inline v8f load8_n(const T* p, int64_t n) {
  T b[8] = {};
  for (int64_t k = 0; k < n; ++k) b[k] = p[k];
  return load8(b);
}
template <class T>
inline void store8_n(T* p, v8f v, int64_t n) {
  T b[8];
  store8(b, v);
  for (int64_t k = 0; k < n; ++k) p[k] = b[k];
}

// AVX512_BF16's vcvtneps2bf16 (with AVX512VL: 8 floats) rounds to bf16 in one instruction, to nearest even with a
// NaN quieted as float_to_bf16 does, where store8 above takes a dozen; but it flushes subnormal inputs to zero, so a
// vector holding one takes store8 instead. Inline asm, so the kernels keep the AVX2 build's code generation (no
// target attributes to thread through templates); it runs only where has_bf16_cvt() found the instructions.
inline bool has_bf16_cvt() {
#if defined(__AVX2__) && defined(__GNUC__)
  static const bool on = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
  return on;
#else
  return false;
#endif
}
// Whether no lane of v is subnormal (zero, normal, infinite and NaN lanes pass). With a = |v|'s bits, a lane is
// subnormal where a - 0x800000 < 0 <= a - 1; testc tests that for all lanes in one instruction.
inline bool no_subnormal8(v8f v) {
#ifdef __AVX2__
  const __m256i a = _mm256_and_si256(std::bit_cast<__m256i>(v), _mm256_set1_epi32(0x7fffffff));
  return _mm256_testc_ps(_mm256_castsi256_ps(_mm256_sub_epi32(a, _mm256_set1_epi32(1))),
                         _mm256_castsi256_ps(_mm256_sub_epi32(a, _mm256_set1_epi32(0x800000))));
#else
  const v8u a = std::bit_cast<v8u>(v) & 0x7fffffffu;
  for (int k = 0; k < 8; ++k)
    if (a[k] != 0 && a[k] < 0x800000u) return false;
  return true;
#endif
}
// store8 for a kernel instantiated with kCvt = has_bf16_cvt() (with_bf16_cvt); the same bits either way.
template <bool kCvt, class T>
inline void store8_as(T* p, v8f v) {
#if defined(__AVX2__) && defined(__GNUC__)
  if constexpr (kCvt && std::is_same_v<T, bf16>) {
    if (no_subnormal8(v)) {
      const __m256 x = std::bit_cast<__m256>(v);
      __m128i r;
      asm("vcvtneps2bf16y %1, %0" : "=x"(r) : "x"(x));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), r);
      return;
    }
  }
#endif
  store8(p, v);
}
// Calls f(std::true_type{}) where has_bf16_cvt(), else f(std::false_type{}): the kernel's kCvt.
template <class F>
inline void with_bf16_cvt(F&& f) {
  if (has_bf16_cvt())
    f(std::true_type{});
  else
    f(std::false_type{});
}

// In-loop conversion for the row kernels: a kernel written on load8/store8 (float or bf16 overloads) reads and
// writes its tensors' storage directly, converting in registers, instead of staging rows through float buffers.
// y[i] = f(x[i]) and y[i] = f(a[i], b[i]) by vectors of 8, the tail through zero-padded vectors; y may equal x, a
// or b element for element (each vector is read before it is stored).
template <bool kCvt, class X, class Y, class F>
inline void map8_io(const X* x, Y* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8_as<kCvt>(y + i, f(load8(x + i)));
  if (i < n) store8_n(y + i, f(load8_n(x + i, n - i)), n - i);
}
template <bool kCvt, class A, class B, class Y, class F>
inline void map8_io2(const A* a, const B* b, Y* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8_as<kCvt>(y + i, f(load8(a + i), load8(b + i)));
  if (i < n) store8_n(y + i, f(load8_n(a + i, n - i), load8_n(b + i, n - i)), n - i);
}

// a * b + c rounded once (vfmadd), for the reductions that must repeat exactly in another code path.
inline v8f fma8(v8f a, v8f b, v8f c) {
#ifdef __FMA__
  return std::bit_cast<v8f>(
      _mm256_fmadd_ps(std::bit_cast<__m256>(a), std::bit_cast<__m256>(b), std::bit_cast<__m256>(c)));
#else
  v8f r;
  for (int k = 0; k < 8; ++k) r[k] = std::fma(a[k], b[k], c[k]);
  return r;
#endif
}

// 16 bf16 values in one load, as the even-indexed ones (p[0], p[2], ...) and the odd ones: one shift or mask per 8
// instead of a widening load and a shift. For reductions, whose order is theirs to choose.
inline void load16_eo(const bf16* p, v8f* even, v8f* odd) {
#ifdef __AVX2__
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *even = std::bit_cast<v8f>(_mm256_slli_epi32(v, 16));
  *odd = std::bit_cast<v8f>(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
#else
  for (int k = 0; k < 8; ++k) {
    (*even)[k] = to_f32(p[2 * k]);
    (*odd)[k] = to_f32(p[2 * k + 1]);
  }
#endif
}

// Reductions for the row kernels that convert in the loop. Their rows are a few vectors long (attention's 64 columns,
// a layer norm's 128), so a row's time is its dependency chain: one accumulator adds 4 cycles a vector and a lane by
// lane sum 8 adds more. sum8_by4 sums f(j) for j = 0, 8, ... below n8 (a multiple of 8) in four accumulators, then
// across lanes as a tree (hsum8_tree); hmax8 is the tree of max(a, b) = a < b ? b : a (std::max's: NaN never wins).
inline float hsum8_tree(v8f v) {
#ifdef __AVX2__
  const __m256 x = std::bit_cast<__m256>(v);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
#endif
}
inline float hmax8(v8f v) {
#ifdef __AVX2__
  const __m256 x = std::bit_cast<__m256>(v);  // _mm_max_ps(b, a) is b > a ? b : a, so its operands go swapped
  __m128 m = _mm_max_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  m = _mm_max_ps(_mm_movehl_ps(m, m), m);
  m = _mm_max_ss(_mm_movehdup_ps(m), m);
  return _mm_cvtss_f32(m);
#else
  float m = v[0];
  for (int k = 1; k < 8; ++k) m = m < v[k] ? v[k] : m;
  return m;
#endif
}
template <class F>
inline float sum8_by4(int64_t n8, F f) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t j = 0;
  for (; j + 32 <= n8; j += 32) {
    a0 += f(j);
    a1 += f(j + 8);
    a2 += f(j + 16);
    a3 += f(j + 24);
  }
  for (; j < n8; j += 8) a0 += f(j);
  return hsum8_tree((a0 + a1) + (a2 + a3));
}

// n values between bf16 storage and float32.
inline void bf16_to_f32(const bf16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(d + i, load8(s + i));
  for (; i < n; ++i) d[i] = to_f32(s[i]);
}
inline void f32_to_bf16(const float* s, bf16* d, int64_t n) {
  const bool cvt = has_bf16_cvt();
  int64_t i = 0;
  if (cvt)
    for (; i + 8 <= n; i += 8) store8_as<true>(d + i, load8(s + i));
  else
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
