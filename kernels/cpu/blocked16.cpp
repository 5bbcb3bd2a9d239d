// The bf16 layout transposes of conv_dnnl.cpp (blocked16.hpp).
#include "blocked16.hpp"

#include <algorithm>
#include <utility>

#include "bf16_io_conv.hpp"
#include "kiln/half.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KILN_CONV_AVX2_REORDER 1
#endif

namespace kiln::cpu {
namespace {

#ifdef KILN_CONV_AVX2_REORDER

// A 16 x 16 block of 16-bit values: row i of dst is column i of src (strides in elements). With Bias, row i of dst
// holds bf16 values and gets bias[i] added as BiasAdd on bf16 storage adds it (in float32, rounded to bf16 once:
// kiln/half.hpp's float_to_bf16, NaN kept quiet); with Relu, ActivationForward's ReLU follows on the bf16 bits
// (v < 0 ? +0 : v): a number below zero (as int16: -32767 to -128, sign set, magnitude neither 0 nor NaN) becomes
// +0; -0 and NaN pass. So a fused conv + bias + ReLU stores the unfused ops' bits.
__attribute__((target("avx2"), always_inline)) inline __m256i relu_bits(__m256i v) {
  const __m256i neg = _mm256_and_si256(_mm256_cmpgt_epi16(v, _mm256_set1_epi16(-32768)),
                                       _mm256_cmpgt_epi16(_mm256_set1_epi16(-127), v));
  return _mm256_andnot_si256(neg, v);
}
// bf16 v + b, rounded by narrow8 (bf16_io_conv.hpp: vcvtneps2bf16 with cvt, where AVX512_BF16 has it).
__attribute__((target("avx2"))) __m256i add_bias_bf16(__m256i v, float b, bool cvt) {
  const __m256 bb = _mm256_set1_ps(b);
  const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16));
  const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16));
  return _mm256_set_m128i(bf16io::narrow8(_mm256_add_ps(hi, bb), cvt), bf16io::narrow8(_mm256_add_ps(lo, bb), cvt));
}
// Row `row` of a transposed block, with the bias and the ReLU as transpose16x16_u16 says. (A function rather than a
// lambda: a lambda does not take its enclosing function's target attribute, and the portable build has no AVX2.)
template <bool Bias, bool Relu>
__attribute__((target("avx2"))) void store_row(__m256i v, uint16_t* dst, const float* bias, int row, bool cvt) {
  if constexpr (Bias) v = add_bias_bf16(v, bias[row], cvt);
  if constexpr (Relu) v = relu_bits(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
}
// The 16 rows into registers, as 16 separate loads: written as a loop, GCC turned the loads of a contiguous block
// (the from-blocked direction, src stride 16) into a `rep movsq` copy onto the stack that the shuffles then read back
// through a store-forwarding stall; perf put three quarters of that transpose's samples on it.
template <size_t... I>
__attribute__((target("avx2"), always_inline)) inline void load_rows(__m256i* r, const uint16_t* src, int64_t ss,
                                                                     std::index_sequence<I...>) {
  ((r[I] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + static_cast<int64_t>(I) * ss))), ...);
}
// The 16 x 16 transpose itself, in place: rows r[0..15] in; out, row c of the transposed block is transposed_row(r, c).
// (Returning the rows in an array instead let GCC turn the 16 stores of a contiguous destination, the to-blocked
// direction, into a `rep movsq` copy of that array: 18% of the transpose's samples on the ResNet.)
__attribute__((target("avx2"), always_inline)) inline void transpose_regs(__m256i* r) {
  __m256i t[16];
  // Within each 128-bit lane: an 8 x 8 transpose of rows 0-7 and of rows 8-15 (the low lane holds columns 0-7,
  // the high lane columns 8-15).
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + 2 * i] = _mm256_unpacklo_epi16(r[h + 2 * i], r[h + 2 * i + 1]);
      t[h + 2 * i + 1] = _mm256_unpackhi_epi16(r[h + 2 * i], r[h + 2 * i + 1]);
    }
    // t[h+0]: columns 0-3 of rows 0,1; t[h+1]: columns 4-7 of rows 0,1; t[h+2], t[h+3]: rows 2,3; ...
    __m256i u[8];
    for (int i = 0; i < 2; ++i) {
      const int a = h + 4 * i;                                   // rows 4i .. 4i+3 of this half
      u[4 * i + 0] = _mm256_unpacklo_epi32(t[a], t[a + 2]);      // columns 0,1
      u[4 * i + 1] = _mm256_unpackhi_epi32(t[a], t[a + 2]);      // columns 2,3
      u[4 * i + 2] = _mm256_unpacklo_epi32(t[a + 1], t[a + 3]);  // columns 4,5
      u[4 * i + 3] = _mm256_unpackhi_epi32(t[a + 1], t[a + 3]);  // columns 6,7
    }
    for (int c = 0; c < 4; ++c) {
      r[h + 2 * c] = _mm256_unpacklo_epi64(u[c], u[4 + c]);      // column 2c: 8 rows
      r[h + 2 * c + 1] = _mm256_unpackhi_epi64(u[c], u[4 + c]);  // column 2c+1
    }
  }
}
__attribute__((target("avx2"), always_inline)) inline __m256i transposed_row(const __m256i* r, int c) {
  return c < 8 ? _mm256_permute2x128_si256(r[c], r[8 + c], 0x20) : _mm256_permute2x128_si256(r[c - 8], r[c], 0x31);
}
// Each 16-row side of a block (the source of the to-blocked direction, the destination of from-blocked) is 16 streams
// hw values apart, more than the hardware prefetchers keep up with. Every other 16 pixels the 64-byte line
// kAheadPixels further on in each row is asked for, for reading, or for writing (the stores' read-for-ownership).
// Past a row's end that is the next row's start, past the last row the next block's: memory the next pixels use.
// Blocks of 16 images from memory, one thread: to-blocked 256 x 32 x 28x28 3.2-3.5 -> 2.4-2.5 ms, from-blocked
// 256 x 64 x 14x14 1.7-2.4 -> 1.0-1.1 ms (with the rows stored in order, below).
constexpr int64_t kAheadPixels = 32;
template <bool Write>
__attribute__((always_inline)) inline void prefetch_rows(const uint16_t* row0, int64_t stride, int64_t p) {
  if ((p & 31) != 0) return;
  for (int64_t j = 0; j < 16; ++j) __builtin_prefetch(row0 + j * stride + p + kAheadPixels, Write ? 1 : 0);
}
template <bool Bias, bool Relu>
__attribute__((target("avx2"))) void transpose16x16_u16(const uint16_t* src, int64_t ss, uint16_t* dst, int64_t ds,
                                                        const float* bias = nullptr, bool cvt = false) {
  __m256i r[16];
  load_rows(r, src, ss, std::make_index_sequence<16>());
  transpose_regs(r);
  for (int c = 0; c < 16; ++c) store_row<Bias, Relu>(transposed_row(r, c), dst + c * ds, bias, c, cvt);
}

// (GCC 12 warns that its own AVX-512 intrinsics' _mm512_undefined_* values may be used uninitialized, GCC bug
// 105593, fixed in GCC 13: a false positive.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define KILN_BLOCKED16_AVX512 __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
KILN_BLOCKED16_AVX512 inline __m256i bias_row_avx512(const uint16_t* p, __m512 bias) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)), bias);
  return bf16io::round16_avx512(v);
}
// From the blocks with the bias, on AVX-512 with AVX512_BF16: in the blocked layout a row of 16 values is one pixel's
// 16 channels, so the bias is one vector for every row and is added before the transpose, 16 values an instruction,
// rounded by vcvtneps2bf16 (a row holding a subnormal sum takes float_to_bf16's integer rounding, as
// bf16_rows.hpp's store16_avx512 does): the AVX2 path's bits, in about a third of its instructions a row.
template <bool Relu>
KILN_BLOCKED16_AVX512 void from_blocked_bias_avx512(const uint16_t* s, uint16_t* t, int64_t hw, const float* b) {
  const __m512 bias = _mm512_loadu_ps(b);
  int64_t p = 0;
  for (; p + 16 <= hw; p += 16) {
    prefetch_rows<true>(t, hw, p);
    __m256i r[16];
    for (int i = 0; i < 16; ++i) r[i] = bias_row_avx512(s + (p + i) * 16, bias);
    transpose_regs(r);
    for (int c = 0; c < 16; ++c) {
      const __m256i v = transposed_row(r, c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + c * hw + p), Relu ? relu_bits(v) : v);
    }
  }
  // The last rem < 16 pixels (a 14x14 image's 4): the rows past them zero, never read, and masked stores, so neither
  // the next image's blocks are read nor the next channel's first pixels overwritten.
  if (const int64_t rem = hw - p; rem > 0) {
    __m256i r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rem ? bias_row_avx512(s + (p + i) * 16, bias) : _mm256_setzero_si256();
    transpose_regs(r);
    const auto k = static_cast<__mmask16>((1u << rem) - 1u);
    for (int c = 0; c < 16; ++c) {
      const __m256i v = transposed_row(r, c);
      _mm256_mask_storeu_epi16(t + c * hw + p, k, Relu ? relu_bits(v) : v);
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
bool has_avx2() {
  static const bool on = __builtin_cpu_supports("avx2");
  return on;
}
#endif

uint16_t relu_bf16_bits(uint16_t h) {
  const uint16_t mag = h & 0x7fffu;
  return (h & 0x8000u) && mag != 0 && mag <= 0x7f80u ? uint16_t{0} : h;
}
}  // namespace

void blocked16(Reorder16 dir, const Dims16& d, const uint16_t* from, uint16_t* to, const float* bias, bool relu) {
  const int64_t hw = d.hw, blocks = d.c / 16;
  for (int64_t blk = 0; blk < d.n * blocks; ++blk) {
    const uint16_t* s = from + blk * 16 * hw;
    uint16_t* t = to + blk * 16 * hw;
    const float* b = bias ? bias + 16 * (blk % blocks) : nullptr;
    int64_t p = 0;
#ifdef KILN_CONV_AVX2_REORDER
    if (b && dir == Reorder16::from_blocked && bf16io::has_avx512_bf16()) {
      if (relu)
        from_blocked_bias_avx512<true>(s, t, hw, b);
      else
        from_blocked_bias_avx512<false>(s, t, hw, b);
      p = hw;
    } else if (has_avx2()) {
      const bool cvt = b && bf16io::has_bf16_cvt8();
      for (; p + 16 <= hw; p += 16) {
        if (dir == Reorder16::to_blocked) {
          prefetch_rows<false>(s, hw, p);
          transpose16x16_u16<false, false>(s + p, hw, t + p * 16, 16);
          continue;
        }
        prefetch_rows<true>(t, hw, p);
        if (b && relu)
          transpose16x16_u16<true, true>(s + p * 16, 16, t + p, hw, b, cvt);
        else if (b)
          transpose16x16_u16<true, false>(s + p * 16, 16, t + p, hw, b, cvt);
        else if (relu)
          transpose16x16_u16<false, true>(s + p * 16, 16, t + p, hw);
        else
          transpose16x16_u16<false, false>(s + p * 16, 16, t + p, hw);
      }
    }
#endif
    for (; p < hw; ++p)
      for (int64_t j = 0; j < 16; ++j) {
        if (dir == Reorder16::to_blocked) {
          t[p * 16 + j] = s[j * hw + p];
          continue;
        }
        uint16_t v = s[p * 16 + j];
        if (b) v = float_to_bf16(bf16_to_float(v) + b[j]);
        t[j * hw + p] = relu ? relu_bf16_bits(v) : v;
      }
  }
}

void transpose16_cols(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* y, int64_t cb, int64_t ce) {
  for (int64_t c0 = cb; c0 < ce; c0 += 16) {
    const int64_t c1 = std::min(ce, c0 + 16);
    int64_t r0 = 0;
#ifdef KILN_CONV_AVX2_REORDER
    if (c1 - c0 == 16 && has_avx2())
      for (; r0 + 16 <= rows; r0 += 16)
        transpose16x16_u16<false, false>(x + r0 * cols + c0, cols, y + c0 * rows + r0, rows);
#endif
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t r = r0; r < rows; ++r) y[c * rows + r] = x[r * cols + c];
  }
}

}  // namespace kiln::cpu
