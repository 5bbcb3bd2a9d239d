// Cast between float32 and the 16-bit storage types (bf16, f16), rounding to nearest even as kiln/half.hpp does, bit
// for bit. Vectorized: bf16 with AVX-512 (16 values an instruction, chosen at run time where the CPU has it; the
// build targets AVX2) or AVX2 integer rounding, f16 with F16C (NaN blocks through kiln/half.hpp, whose quiet-NaN
// bits F16C does not reproduce). The bf16 rounding is done in integer arithmetic rather than AVX512_BF16's
// vcvtne2ps2bf16, which flushes subnormal inputs to zero and so would differ from kiln/half.hpp (and PyTorch).
#include <cstring>

#include "bf16_io.hpp"
#include "bf16_io_conv.hpp"
#include "cpu_kernel.hpp"
#include "kiln/half.hpp"
#include "thread_pool.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KILN_CAST_AVX512 1
#endif

namespace kiln::cpu {
namespace {

#ifdef KILN_CAST_AVX512
// (GCC 12 warns that its own AVX-512 intrinsics' _mm512_undefined_* values may be used uninitialized, GCC bug
// 105593, fixed in GCC 13: a false positive.)
#ifndef __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw"))) void f32_to_bf16_avx512(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), bf16io::narrow16_avx512(_mm512_loadu_ps(s + i)));
  for (; i < n; ++i) d[i] = float_to_bf16(s[i]);
}
__attribute__((target("avx512f,avx512bw"))) void bf16_to_f32_avx512(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) d[i] = bf16_to_float(s[i]);
}
#ifndef __clang__
#pragma GCC diagnostic pop
#endif
bool has_avx512() {
  static const bool on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return on;
}
#endif

void to_bf16(const float* s, uint16_t* d, size_t n) {
#ifdef KILN_CAST_AVX512
  if (has_avx512()) return f32_to_bf16_avx512(s, d, n);
#endif
  f32_to_bf16(s, reinterpret_cast<bf16*>(d), static_cast<int64_t>(n));
}
void from_bf16(const uint16_t* s, float* d, size_t n) {
#ifdef KILN_CAST_AVX512
  if (has_avx512()) return bf16_to_f32_avx512(s, d, n);
#endif
  bf16_to_f32(reinterpret_cast<const bf16*>(s), d, static_cast<int64_t>(n));
}

void to_f16(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j) d[j] = float_to_f16(s[j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) d[i] = float_to_f16(s[i]);
}
void from_f16(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0) {
      for (size_t j = i; j < i + 8; ++j) d[j] = f16_to_float(s[j]);
      continue;
    }
    _mm256_storeu_ps(d + i, x);
  }
#endif
  for (; i < n; ++i) d[i] = f16_to_float(s[i]);
}

void cast(const CastAttrs& a, const void* x, void* y, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (e <= b) return;
    const auto n = static_cast<size_t>(e - b);
    if (a.from == a.to) {
      std::memcpy(static_cast<char*>(y) + b * static_cast<int64_t>(dtype_size(a.to)),
                  static_cast<const char*>(x) + b * static_cast<int64_t>(dtype_size(a.from)), n * dtype_size(a.to));
    } else if (a.from == DType::f32) {
      const float* s = static_cast<const float*>(x) + b;
      auto* d = static_cast<uint16_t*>(y) + b;
      a.to == DType::bf16 ? to_bf16(s, d, n) : to_f16(s, d, n);
    } else if (a.to == DType::f32) {
      const auto* s = static_cast<const uint16_t*>(x) + b;
      float* d = static_cast<float*>(y) + b;
      a.from == DType::bf16 ? from_bf16(s, d, n) : from_f16(s, d, n);
    } else {  // bf16 <-> f16 through float32 (exact: float32 holds both)
      const auto* s = static_cast<const uint16_t*>(x) + b;
      auto* d = static_cast<uint16_t*>(y) + b;
      for (size_t i = 0; i < n; ++i) d[i] = float_to_half(half_to_float(s[i], a.from), a.to);
    }
  });
}

}  // namespace

KILN_CPU_KERNEL("cast", {[](CpuDevice& d, const OpCall& c) {
                           cast(attrs<CastAttrs>(c), c.in[0].raw(), c.out[0].raw(), d.pool());
                         },
                         nullptr, nullptr, [](const OpCall&) { return true; }});

}  // namespace kiln::cpu
