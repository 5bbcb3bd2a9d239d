// Max and average pooling: (n, c) planes in ranges over the device's thread pool (planes never share output).
#include "pool.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "bf16_io_conv.hpp"
#include "bias.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace kiln::cpu {
namespace {

#ifdef __AVX2__
// The first n floats at p (n >= 8: a whole vector; fewer: masked, the other lanes 0, and lanes past n neither read nor
// written, so nothing past the end of a buffer is touched), and the store of the first n lanes.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(n, 0, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 load_first(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(n));
}
inline void store_first(float* p, int64_t n, __m256 v) {
  if (n >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, first_lanes(n), v);
}
// The same for bf16 storage: widened to float32 lanes on load, rounded to bf16 (bf16io::narrow's rule) on store.
inline __m256 widen8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
// Fewer than 8: the whole pairs by a masked 32-bit load and an odd last value put into its lane, in registers. (Values
// copied one by one into a buffer and loaded as one vector stall on store forwarding: under perf that load held a
// fifth of the CNN's bf16 pool backward, whose 7-wide rows end each plane with one.)
inline __m128i first_pairs(int64_t pairs) {
  return _mm_cmpgt_epi32(_mm_set1_epi32(static_cast<int>(pairs)), _mm_setr_epi32(0, 1, 2, 3));
}
inline __m256 load_first(const uint16_t* p, int64_t n) {
  if (n >= 8) return widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if (n <= 0) return _mm256_setzero_ps();
  const int64_t pairs = n / 2;
  __m128i v = _mm_maskload_epi32(reinterpret_cast<const int*>(p), first_pairs(pairs));
  if (n & 1) {
    const __m128i at = _mm_cmpeq_epi32(_mm_set1_epi32(static_cast<int>(pairs)), _mm_setr_epi32(0, 1, 2, 3));
    v = _mm_or_si128(v, _mm_and_si128(_mm_set1_epi32(p[n - 1]), at));
  }
  return widen8(v);
}
// Every value a max pool stores is one of its bf16 inputs (a maximum, a gradient, or +0), exact in bf16: its
// upper 16 bits are its bf16 bits, so no rounding (which would give the same bits) is spent on it.
inline __m128i bf16_bits_of_exact(__m256 v) {
  const __m256i s = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
inline void store_first(uint16_t* p, int64_t n, __m256 v) {
  const __m128i h = bf16_bits_of_exact(v);
  if (n >= 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  alignas(16) uint16_t t[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
  for (int64_t i = 0; i < n; ++i) p[i] = t[i];
}
// The first n of 16 consecutive values of a row split into the 8 even and the 8 odd ones, in order (the two columns
// of 8 windows); n is twice the windows, so even. On bf16 the values are n / 2 32-bit lanes each holding one window's
// pair, the even column in the low half: the columns come out with a shift and a mask, and go back (interleave) with a
// shift and an or, where float32 needs cross-lane shuffles.
template <class T>
inline void deinterleave(const T* p, int64_t n, __m256& even, __m256& odd) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    const __m256i v = n >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), first_lanes(n / 2));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    const __m256 a = load_first(p, n), b = load_first(p + 8, n - 8);
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  }
}
// The inverse: p[2i] = even[i], p[2i + 1] = odd[i], the first n values (n even). bf16 lanes hold exact bf16 values
// (store_first): their upper 16 bits.
template <class T>
inline void interleave(T* p, int64_t n, __m256 even, __m256 odd) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    const __m256i hi = _mm256_and_si256(_mm256_castps_si256(odd), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    const __m256i v = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(even), 16), hi);
    if (n >= 16) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    alignas(32) uint32_t t[8];  // no masked store: slow on AMD's cores
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), v);
    for (int64_t i = 0; i < n / 2; ++i) std::memcpy(p + 2 * i, t + i, 4);
  } else {
    const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    store_first(p, n, _mm256_permute2f128_ps(lo, hi, 0x20));
    store_first(p + 8, n - 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

// The next 8 windows of output row oy of a 2x2 stride-2 pool, from window ox on: how many lanes to load and store (8,
// or the n < 8 windows left, masked). A row's last few windows are the last 8 again, overlapping those done (the same
// values are written twice); a row of fewer than 8 loads and stores whole vectors where those stay inside this plane
// (the extra outputs land on the next rows, which are written later), masked only at the plane's end: masked stores
// are slow on AMD's cores.
inline int64_t next_windows(const PoolAttrs& a, int64_t oy, int64_t& ox) {
  int64_t n = std::min<int64_t>(8, a.ow - ox);
  if (n < 8 && ox > 0) ox = a.ow - 8, n = 8;
  const bool whole = (2 * oy + 1) * a.w + 2 * ox + 16 <= a.h * a.w && oy * a.ow + ox + 8 <= a.oh * a.ow;
  return whole ? 8 : n;
}
// The four corners of `lanes` windows (top-left, top-right, bottom-left, bottom-right), and the inverse: a value for
// each corner written into rows d0, d1.
template <class T>
inline void corners(const T* r0, const T* r1, int64_t ox, int64_t lanes, __m256& t0, __m256& t1, __m256& b0,
                    __m256& b1) {
  deinterleave(r0 + 2 * ox, 2 * lanes, t0, t1);
  deinterleave(r1 + 2 * ox, 2 * lanes, b0, b1);
}
template <class T>
inline void put_corners(T* d0, T* d1, int64_t ox, int64_t lanes, __m256 t0, __m256 t1, __m256 b0, __m256 b1) {
  interleave(d0 + 2 * ox, 2 * lanes, t0, t1);
  interleave(d1 + 2 * ox, 2 * lanes, b0, b1);
}
#endif

// The 2x2 stride-2 max pool forward on bf16 at 16 windows a vector, where the CPU has AVX-512 (BW, VL): a window's
// pair in a row is one 32-bit lane, so a row of up to 16 windows is one masked load (the CNN's 14-wide rows one vector
// instead of two overlapping ones), the columns split by a shift and a mask as above, and the stores masked (no
// value-by-value tail). The same comparisons in the same order as the AVX2 and scalar paths, so the same bits. (The
// backward pass written the same way was slower on the CNN's 7-wide rows, 0.91-0.98 against 0.73-0.78 ms a step, and
// no faster on its 14-wide ones: it stays on AVX2, but for planes whose rows are at most 16 values, which take
// max_pool_backward_pairs_bf16_avx512 below.)
#if defined(__AVX2__) && defined(__GNUC__)
// GCC 12 warns that its own AVX-512 intrinsics' _mm512_undefined_* values may be used uninitialized (GCC bug 105593,
// fixed in GCC 13): a false positive.
#ifndef __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define KILN_POOL_AVX512 1
#define KILN_POOL_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
bool pool_has_avx512() {
  static const bool on =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return on;
}
KILN_POOL_AVX512_TARGET inline __mmask16 first16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}
// The four corners of the windows [ox, ox + n) of rows r0, r1 (top-left, top-right, bottom-left, bottom-right).
KILN_POOL_AVX512_TARGET inline void corners16(const uint16_t* r0, const uint16_t* r1, __mmask16 k, __m512& t0,
                                              __m512& t1, __m512& b0, __m512& b1) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i v0 = _mm512_maskz_loadu_epi32(k, r0), v1 = _mm512_maskz_loadu_epi32(k, r1);
  t0 = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
  t1 = _mm512_castsi512_ps(_mm512_and_si512(v0, hi));
  b0 = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
  b1 = _mm512_castsi512_ps(_mm512_and_si512(v1, hi));
}
KILN_POOL_AVX512_TARGET void max_pool_planes_bf16_avx512(const PoolAttrs& a, const uint16_t* x, uint16_t* y, int64_t pb,
                                                         int64_t pe) {
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  for (int64_t p = pb; p < pe; ++p)
    for (int64_t oy = 0; oy < a.oh; ++oy) {
      const uint16_t* r0 = x + p * in_plane + 2 * oy * a.w;
      uint16_t* yr = y + p * out_plane + oy * a.ow;
      for (int64_t ox = 0; ox < a.ow; ox += 16) {
        const __mmask16 k = first16(a.ow - ox);
        __m512 t0, t1, b0, b1;
        corners16(r0 + 2 * ox, r0 + a.w + 2 * ox, k, t0, t1, b0, b1);
        __m512 m = t0;  // first element wins ties and NaN (ordered greater-than)
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(t1, m, _CMP_GT_OQ), t1);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(b0, m, _CMP_GT_OQ), b0);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(b1, m, _CMP_GT_OQ), b1);
        _mm256_mask_storeu_epi16(yr + ox, k, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m), 16)));
      }
    }
}
// The 2x2 stride-2 max pool backward (with the ReLU's gradient, and the bias gradient's plane sums) on bf16 for planes
// [pb, pe) whose rows are at most 16 values, an even count (the CNN's 14x14 planes, 7-wide rows of windows): a row of
// windows covers two image rows, which are 2w consecutive values, so one masked load holds every window of the row,
// top pairs in 32-bit lanes [0, ow), bottom pairs in [ow, 2 ow); y and dy go to both halves by one permute. The same
// comparisons and the same first-match rule as the AVX2 path (ordered ==, the ReLU's y > 0), on masks, and dy's bits
// or +0 stored by one masked store of the two rows: the AVX2 path's bits, where that path took two partial loads and
// stores per row.
KILN_POOL_AVX512_TARGET void max_pool_backward_pairs_bf16_avx512(const PoolAttrs& a, const uint16_t* x,
                                                                 const uint16_t* y, const uint16_t* dy, uint16_t* dx,
                                                                 bool relu_grad, float* plane_sums, int64_t pb,
                                                                 int64_t pe) {
  const int64_t w = a.w, ow = a.ow, in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const auto kx = static_cast<__mmask32>(w == 16 ? 0xffffffffu : (1u << (2 * w)) - 1u);
  const auto ky = static_cast<__mmask16>((1u << ow) - 1u);
  const uint32_t m = (1u << ow) - 1u;
  alignas(64) int32_t lane[16];
  for (int j = 0; j < 16; ++j) lane[j] = static_cast<int32_t>(j < ow ? j : std::min<int64_t>(j - ow, ow - 1));
  const __m512i idx = _mm512_load_si512(lane), hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t p = pb; p < pe; ++p) {
    const uint16_t *xp = x + p * in_plane, *yp = y + p * out_plane, *gp = dy + p * out_plane;
    uint16_t* dxp = dx + p * in_plane;
    for (int64_t oy = 0; oy < a.oh; ++oy) {
      const __m512i v = _mm512_maskz_loadu_epi16(kx, xp + 2 * oy * w);
      const __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
                   od = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      const __m512i yz =
          _mm512_permutexvar_epi32(idx, _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(ky, yp + oy * ow)));
      const __m512i gz =
          _mm512_permutexvar_epi32(idx, _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(ky, gp + oy * ow)));
      const __m512 yv = _mm512_castsi512_ps(_mm512_slli_epi32(yz, 16));
      const uint32_t ee = _mm512_cmp_ps_mask(ev, yv, _CMP_EQ_OQ), eo = _mm512_cmp_ps_mask(od, yv, _CMP_EQ_OQ);
      const uint32_t live = relu_grad ? _mm512_cmp_ps_mask(yv, _mm512_setzero_ps(), _CMP_GT_OQ) & m : m;
      const uint32_t e0 = ee & m, e1 = eo & m, e2 = (ee >> ow) & m, e3 = (eo >> ow) & m;
      const uint32_t g0 = e0 & live, g1 = e1 & ~e0 & live, g2 = e2 & ~(e0 | e1) & live,
                     g3 = e3 & ~(e0 | e1 | e2) & live;
      const auto me = static_cast<__mmask16>(g0 | (g2 << ow)), mo = static_cast<__mmask16>(g1 | (g3 << ow));
      const __m512i out =
          _mm512_or_si512(_mm512_maskz_mov_epi32(me, gz), _mm512_maskz_mov_epi32(mo, _mm512_slli_epi32(gz, 16)));
      _mm512_mask_storeu_epi16(dxp + 2 * oy * w, kx, out);
    }
    std::fill(dxp + 2 * a.oh * w, dxp + in_plane, uint16_t{0});  // an odd last row is in no window
    if (plane_sums) plane_sums[p] = bias_plane_sum(dxp, in_plane);
  }
}
#ifndef __clang__
#pragma GCC diagnostic pop
#endif
#endif

struct Window {
  int64_t y0, y1, x0, x1;  // clipped to the image, [y0, y1) x [x0, x1)
  int64_t count() const { return std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0); }
};

Window window(const PoolAttrs& a, int64_t oy, int64_t ox) {
  const int64_t ty = oy * a.stride_h - a.pad_h, tx = ox * a.stride_w - a.pad_w;
  return {std::max<int64_t>(ty, 0), std::min<int64_t>(ty + a.kh, a.h), std::max<int64_t>(tx, 0),
          std::min<int64_t>(tx + a.kw, a.w)};
}

// g where m == 1, +0 where m == 0, by masking bits (no branch even in the scalar remainder of a loop).
inline float keep_if(int m, float g) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(g) & (0u - static_cast<uint32_t>(m)));
}

bool is_2x2_s2(const PoolAttrs& a) {
  return a.kh == 2 && a.kw == 2 && a.stride_h == 2 && a.stride_w == 2 && a.pad_h == 0 && a.pad_w == 0 &&
         a.oh * 2 <= a.h && a.ow * 2 <= a.w;
}

}  // namespace

namespace {

// T: float, or uint16_t holding bf16 (loaded into float32 lanes, stored rounded: a maximum of bf16 values is one of
// them, so bf16 storage changes no result).
template <class T>
void max_pool_planes_t(const PoolAttrs& a, const T* x, T* y, int64_t pb, int64_t pe) {
  using bf16io::load;
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const bool fast = is_2x2_s2(a);
#ifdef KILN_POOL_AVX512
  if constexpr (std::is_same_v<T, uint16_t>)
    if (fast && pool_has_avx512()) return max_pool_planes_bf16_avx512(a, x, y, pb, pe);
#endif
  for (int64_t p = pb; p < pe; ++p) {
    const T* xp = x + p * in_plane;
    T* yp = y + p * out_plane;
    for (int64_t oy = 0; oy < a.oh; ++oy) {
      if (fast) {  // first element wins ties and NaN, as in the general path
        const T* r0 = xp + 2 * oy * a.w;
        const T* r1 = r0 + a.w;
        int64_t ox = 0;
#ifdef __AVX2__
        // 8 windows at a time (next_windows: how the last of a row are done), the same comparisons in the same
        // order as the scalar loop below (ordered greater-than: a NaN never replaces the running maximum, and a
        // NaN first element stays).
        for (; ox < a.ow; ox += 8) {
          const int64_t lanes = next_windows(a, oy, ox);
          __m256 t0, t1, b0, b1;
          corners(r0, r1, ox, lanes, t0, t1, b0, b1);
          __m256 m = t0;
          m = _mm256_blendv_ps(m, t1, _mm256_cmp_ps(t1, m, _CMP_GT_OQ));
          m = _mm256_blendv_ps(m, b0, _mm256_cmp_ps(b0, m, _CMP_GT_OQ));
          m = _mm256_blendv_ps(m, b1, _mm256_cmp_ps(b1, m, _CMP_GT_OQ));
          store_first(yp + oy * a.ow + ox, lanes, m);
        }
#endif
        for (; ox < a.ow; ++ox) {
          float b = load(r0[2 * ox]);
          b = load(r0[2 * ox + 1]) > b ? load(r0[2 * ox + 1]) : b;
          b = load(r1[2 * ox]) > b ? load(r1[2 * ox]) : b;
          b = load(r1[2 * ox + 1]) > b ? load(r1[2 * ox + 1]) : b;
          bf16io::store(yp + oy * a.ow + ox, b);
        }
        continue;
      }
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const Window w = window(a, oy, ox);
        float best = 0.f;
        bool found = false;
        for (int64_t iy = w.y0; iy < w.y1; ++iy)
          for (int64_t ix = w.x0; ix < w.x1; ++ix) {
            const float v = load(xp[iy * a.w + ix]);
            if (!found || v > best) best = v;
            found = true;
          }
        bf16io::store(yp + oy * a.ow + ox, best);
      }
    }
  }
}

}  // namespace

void max_pool_planes(const PoolAttrs& a, const float* x, float* y, int64_t pb, int64_t pe) {
  max_pool_planes_t(a, x, y, pb, pe);
}

namespace {

void max_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool) {
  parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool),
                  [&](int64_t pb, int64_t pe) { max_pool_planes(a, x, y, pb, pe); });
}

}  // namespace

// With relu_grad a window whose maximum yv is not > 0 passes no gradient: its argmax is where x == yv, so
// x > 0 there exactly when yv > 0, and every other position gets 0 from both ops.
namespace {

// T as max_pool_planes_t. On bf16 the general path (overlapping windows) would round each added gradient: run_pool_bf16
// takes only the 2x2 stride-2 path here and widens the planes for the others.
template <class T>
void max_pool_backward_planes_t(const PoolAttrs& a, const T* x, const T* y, const T* dy, T* dx, bool relu_grad,
                                float* plane_sums, int64_t pb, int64_t pe) {
  using bf16io::load;
  using bf16io::store;
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const bool fast = is_2x2_s2(a);
#ifdef KILN_POOL_AVX512
  if constexpr (std::is_same_v<T, uint16_t>)
    if (fast && a.w == 2 * a.ow && a.w <= 16 && pool_has_avx512())
      return max_pool_backward_pairs_bf16_avx512(a, x, y, dy, dx, relu_grad, plane_sums, pb, pe);
#endif
  {
    for (int64_t p = pb; p < pe; ++p) {
      const T* xp = x + p * in_plane;
      T* dxp = dx + p * in_plane;
      if (fast) {  // disjoint windows: write each window's 4 gradients directly, first match wins, no branches
        for (int64_t oy = 0; oy < a.oh; ++oy) {
          const T* r0 = xp + 2 * oy * a.w;
          const T* r1 = r0 + a.w;
          T* d0 = dxp + 2 * oy * a.w;
          T* d1 = d0 + a.w;
          const T* yr = y + p * out_plane + oy * a.ow;
          const T* gr = dy + p * out_plane + oy * a.ow;
          int64_t ox = 0;
#ifdef __AVX2__
          // 8 windows at a time (next_windows), the masks of the scalar loop
          // below, as vector compares (ordered: NaN matches nothing), and g or +0 by masking bits.
          const __m256 zero = _mm256_setzero_ps();
          const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
          for (; ox < a.ow; ox += 8) {
            const int64_t lanes = next_windows(a, oy, ox);
            __m256 t0, t1, b0, b1;
            corners(r0, r1, ox, lanes, t0, t1, b0, b1);
            const __m256 yv = load_first(yr + ox, lanes), g = load_first(gr + ox, lanes);
            const __m256 live = relu_grad ? _mm256_cmp_ps(yv, zero, _CMP_GT_OQ) : all;
            const __m256 e0 = _mm256_cmp_ps(t0, yv, _CMP_EQ_OQ), e1 = _mm256_cmp_ps(t1, yv, _CMP_EQ_OQ);
            const __m256 e2 = _mm256_cmp_ps(b0, yv, _CMP_EQ_OQ), e3 = _mm256_cmp_ps(b1, yv, _CMP_EQ_OQ);
            const __m256 lg = _mm256_and_ps(live, g);
            const __m256 seen01 = _mm256_or_ps(e0, e1), seen012 = _mm256_or_ps(seen01, e2);
            const __m256 g0 = _mm256_and_ps(e0, lg), g1 = _mm256_andnot_ps(e0, _mm256_and_ps(e1, lg));
            const __m256 g2 = _mm256_andnot_ps(seen01, _mm256_and_ps(e2, lg));
            const __m256 g3 = _mm256_andnot_ps(seen012, _mm256_and_ps(e3, lg));
            put_corners(d0, d1, ox, lanes, g0, g1, g2, g3);
          }
#endif
          for (; ox < a.ow; ++ox) {
            // Bitwise, not &&: after a ReLU many windows tie at 0, and short-circuit branches mispredict.
            const float yv = load(yr[ox]), g = load(gr[ox]);
            const int live = !relu_grad | (yv > 0.f);
            const int e0 = load(r0[2 * ox]) == yv, e1 = load(r0[2 * ox + 1]) == yv, e2 = load(r1[2 * ox]) == yv;
            const int e3 = load(r1[2 * ox + 1]) == yv;
            const int m1 = e1 & ~e0 & live, m2 = e2 & ~(e0 | e1) & live, m3 = e3 & ~(e0 | e1 | e2) & live;
            store(d0 + 2 * ox, keep_if(e0 & live, g));
            store(d0 + 2 * ox + 1, keep_if(m1, g));
            store(d1 + 2 * ox, keep_if(m2, g));
            store(d1 + 2 * ox + 1, keep_if(m3, g));
          }
          std::fill(d0 + 2 * a.ow, d0 + a.w, T{});  // an odd last column is in no window
          std::fill(d1 + 2 * a.ow, d1 + a.w, T{});
        }
        std::fill(dxp + 2 * a.oh * a.w, dxp + in_plane, T{});           // likewise an odd last row
        if (plane_sums) plane_sums[p] = bias_plane_sum(dxp, in_plane);  // bias_grad's sum, while the plane is in cache
        continue;
      }
      std::fill(dxp, dxp + in_plane, T{});
      for (int64_t oy = 0; oy < a.oh; ++oy)
        for (int64_t ox = 0; ox < a.ow; ++ox) {
          const int64_t o = p * out_plane + oy * a.ow + ox;
          const float yv = load(y[o]);
          const Window w = window(a, oy, ox);
          for (int64_t iy = w.y0; iy < w.y1; ++iy)
            for (int64_t ix = w.x0; ix < w.x1; ++ix)
              if (load(xp[iy * a.w + ix]) == yv) {
                if (!relu_grad || yv > 0.f) store(dxp + iy * a.w + ix, load(dxp[iy * a.w + ix]) + load(dy[o]));
                goto next;  // only the first match gets the gradient
              }
        next:;
        }
      if (plane_sums) plane_sums[p] = bias_plane_sum(dxp, in_plane);
    }
  }
}

}  // namespace

void max_pool_backward_planes(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx,
                              bool relu_grad, float* plane_sums, int64_t pb, int64_t pe) {
  max_pool_backward_planes_t(a, x, y, dy, dx, relu_grad, plane_sums, pb, pe);
}

void max_pool_backward(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx, ThreadPool& pool,
                       bool relu_grad, float* plane_sums) {
  parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
    max_pool_backward_planes(a, x, y, dy, dx, relu_grad, plane_sums, pb, pe);
  });
}

namespace {

void avg_pool_planes(const PoolAttrs& a, const float* x, float* y, int64_t pb, int64_t pe) {
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  for (int64_t p = pb; p < pe; ++p) {
    const float* xp = x + p * in_plane;
    for (int64_t oy = 0; oy < a.oh; ++oy)
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const Window w = window(a, oy, ox);
        const int64_t count = w.count();
        float sum = 0.f;
        for (int64_t iy = w.y0; iy < w.y1; ++iy)
          for (int64_t ix = w.x0; ix < w.x1; ++ix) sum += xp[iy * a.w + ix];
        y[p * out_plane + oy * a.ow + ox] = count > 0 ? sum / static_cast<float>(count) : 0.f;
      }
  }
}

void avg_pool_backward_planes(const PoolAttrs& a, const float* dy, float* dx, int64_t pb, int64_t pe) {
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  for (int64_t p = pb; p < pe; ++p) {
    float* dxp = dx + p * in_plane;
    std::fill(dxp, dxp + in_plane, 0.f);
    for (int64_t oy = 0; oy < a.oh; ++oy)
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const Window w = window(a, oy, ox);
        const int64_t count = w.count();
        if (count == 0) continue;
        const float g = dy[p * out_plane + oy * a.ow + ox] / static_cast<float>(count);
        for (int64_t iy = w.y0; iy < w.y1; ++iy)
          for (int64_t ix = w.x0; ix < w.x1; ++ix) dxp[iy * a.w + ix] += g;
      }
  }
}

void avg_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool) {
  parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool),
                  [&](int64_t pb, int64_t pe) { avg_pool_planes(a, x, y, pb, pe); });
}

void avg_pool_backward(const PoolAttrs& a, const float* dy, float* dx, ThreadPool& pool) {
  parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool),
                  [&](int64_t pb, int64_t pe) { avg_pool_backward_planes(a, dy, dx, pb, pe); });
}

// ---- bf16 storage ---------------------------------------------------------------------------------------------
// Each thread widens a group of planes of its inputs into float32 in its slot of the workspace, runs the float32
// plane functions above on them (the same comparisons and sums, so the same values before the one rounding of the
// output), and rounds the output planes back to bf16 while they are in cache. A max pool's maximum is one of its
// bf16 inputs, so max-pool outputs are exact and its backward pass finds the same argmax as the float32 one.

// Planes per group: about 32 KiB of input planes, so a group's float32 copies stay in L1/L2, and no more than a
// thread's share of a small tensor (bf16_groups cuts the planes into at least 4 ranges a thread where there is work
// for more than one: parts_for).
int64_t plane_group(const PoolAttrs& a, int threads) {
  const int64_t share = (a.n * a.c + 4 * threads - 1) / (4 * std::max(threads, 1));
  return std::clamp<int64_t>(std::min(8192 / std::max<int64_t>(a.h * a.w, 1), share), 1, 64);
}
// A slot's floats: two input-sized and two output-sized buffers of a group (max-pool backward's x, dx, y, dy).
size_t slot_floats(const PoolAttrs& a, int threads) {
  const size_t g = static_cast<size_t>(plane_group(a, threads));
  return (2 * g * static_cast<size_t>(a.h * a.w) + 2 * g * static_cast<size_t>(a.oh * a.ow) + 15) / 16 * 16;
}

bool all_of_type(const OpCall& c, DType t) {
  for (const auto* list : {&c.in, &c.out})
    for (const auto& v : *list)
      if (v.dtype != t) return false;
  return true;
}
// Every buffer float32, or every one bf16 (a bf16 layer's activations and their gradients).
bool pool_takes(const OpCall& c) { return all_of_type(c, DType::f32) || all_of_type(c, DType::bf16); }
// A 2x2 stride-2 max pool on bf16 runs its float32 code's vector path on the bf16 planes directly (widened in
// registers): no scratch.
bool max_pool_direct(const OpCall& c) {
  return (c.kind == OpKind::MaxPoolForward || c.kind == OpKind::MaxPoolBackward) &&
         is_2x2_s2(std::get<PoolAttrs>(c.attrs));
}
size_t pool_workspace(const CpuDevice& d, const OpCall& c) {
  if (!all_of_type(c, DType::bf16) || max_pool_direct(c)) return 0;
  const auto& a = std::get<PoolAttrs>(c.attrs);
  return static_cast<size_t>(std::max(d.threads(), 1)) * slot_floats(a, d.threads()) * sizeof(float);
}

// Runs fn(p0, m, buf) over the (n, c) planes in groups: planes [p0, p0 + m), buf the calling thread's slot of ws.
template <class Fn>
void bf16_groups(const PoolAttrs& a, float* ws, ThreadPool& pool, Fn fn) {
  const int64_t planes = a.n * a.c, g = plane_group(a, pool.size());
  const int64_t parts = std::min<int64_t>(parts_for(planes * a.h * a.w, pool), std::max<int64_t>(planes, 1));
  const size_t per = slot_floats(a, pool.size());
  pool.run(parts, [&](int64_t part, int slot) {
    const int64_t b = planes * part / parts, e = planes * (part + 1) / parts;
    for (int64_t p0 = b; p0 < e; p0 += g) fn(p0, std::min(g, e - p0), ws + static_cast<size_t>(slot) * per);
  });
}

const uint16_t* bf16_in(const OpCall& c, size_t i) { return static_cast<const uint16_t*>(c.in[i].raw()); }
uint16_t* bf16_out(const OpCall& c) { return static_cast<uint16_t*>(c.out[0].raw()); }

// max_pool_backward_planes on the planes [p0, p0 + m) of bf16 tensors, in a thread's slot.
void max_pool_backward_group_bf16(const PoolAttrs& a, const uint16_t* x, const uint16_t* y, const uint16_t* dy,
                                  uint16_t* dx, bool relu_grad, float* plane_sums, int64_t p0, int64_t m, int64_t g,
                                  float* buf) {
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  float *xi = buf, *dxi = buf + g * in_plane, *yo = dxi + g * in_plane, *dyo = yo + g * out_plane;
  bf16io::widen(x + p0 * in_plane, xi, m * in_plane);
  bf16io::widen(y + p0 * out_plane, yo, m * out_plane);
  bf16io::widen(dy + p0 * out_plane, dyo, m * out_plane);
  max_pool_backward_planes(a, xi, yo, dyo, dxi, relu_grad, plane_sums ? plane_sums + p0 : nullptr, 0, m);
  bf16io::narrow(dxi, dx + p0 * in_plane, m * in_plane);
}

void run_pool_bf16(const OpCall& c, ThreadPool& pool) {
  using bf16io::narrow;
  using bf16io::widen;
  const auto& a = std::get<PoolAttrs>(c.attrs);
  if (max_pool_direct(c)) {
    parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
      if (c.kind == OpKind::MaxPoolForward)
        max_pool_planes_t(a, bf16_in(c, 0), bf16_out(c), pb, pe);
      else
        max_pool_backward_planes_t(a, bf16_in(c, 0), bf16_in(c, 1), bf16_in(c, 2), bf16_out(c), false, nullptr, pb, pe);
    });
    return;
  }
  const int64_t in_plane = a.h * a.w, out_plane = a.oh * a.ow;
  const int64_t g = plane_group(a, pool.size());
  bf16_groups(a, c.workspace.host(), pool, [&](int64_t p0, int64_t m, float* buf) {
    float *xi = buf, *xi2 = buf + g * in_plane, *yo = xi2 + g * in_plane;
    switch (c.kind) {
      case OpKind::MaxPoolForward:
      case OpKind::AvgPoolForward:
        widen(bf16_in(c, 0) + p0 * in_plane, xi, m * in_plane);
        if (c.kind == OpKind::MaxPoolForward)
          max_pool_planes(a, xi, yo, 0, m);
        else
          avg_pool_planes(a, xi, yo, 0, m);
        narrow(yo, bf16_out(c) + p0 * out_plane, m * out_plane);
        break;
      case OpKind::MaxPoolBackward:  // in: x, y, dy; out: dx
        max_pool_backward_group_bf16(a, bf16_in(c, 0), bf16_in(c, 1), bf16_in(c, 2), bf16_out(c), false, nullptr, p0, m,
                                     g, buf);
        break;
      case OpKind::AvgPoolBackward:  // in: dy; out: dx
        widen(bf16_in(c, 0) + p0 * out_plane, yo, m * out_plane);
        avg_pool_backward_planes(a, yo, xi, 0, m);
        narrow(xi, bf16_out(c) + p0 * in_plane, m * in_plane);
        break;
      default:
        break;
    }
  });
}

}  // namespace

void max_pool_planes_bf16(const PoolAttrs& a, const uint16_t* x, uint16_t* y, int64_t pb, int64_t pe) {
  max_pool_planes_t(a, x, y, pb, pe);
}

void max_pool_backward_planes_bf16(const PoolAttrs& a, const uint16_t* x, const uint16_t* y, const uint16_t* dy,
                                   uint16_t* dx, bool relu_grad, float* plane_sums, int64_t pb, int64_t pe) {
  max_pool_backward_planes_t(a, x, y, dy, dx, relu_grad, plane_sums, pb, pe);
}

size_t max_pool_bf16_workspace_bytes(const PoolAttrs& a, int threads) {
  if (is_2x2_s2(a)) return 0;
  return static_cast<size_t>(std::max(threads, 1)) * slot_floats(a, threads) * sizeof(float);
}

void max_pool_backward_bf16(const PoolAttrs& a, const uint16_t* x, const uint16_t* y, const uint16_t* dy, uint16_t* dx,
                            float* ws, ThreadPool& pool, bool relu_grad, float* plane_sums) {
  if (is_2x2_s2(a)) {
    parallel_ranges(pool, a.n * a.c, parts_for(a.n * a.c * a.h * a.w, pool), [&](int64_t pb, int64_t pe) {
      max_pool_backward_planes_t(a, x, y, dy, dx, relu_grad, plane_sums, pb, pe);
    });
    return;
  }
  const int64_t g = plane_group(a, pool.size());
  bf16_groups(a, ws, pool, [&](int64_t p0, int64_t m, float* buf) {
    max_pool_backward_group_bf16(a, x, y, dy, dx, relu_grad, plane_sums, p0, m, g, buf);
  });
}

// ---- registration ---------------------------------------------------------------------------------------------

// Every kernel takes float32 or bf16 storage (pool_takes); bf16 runs through run_pool_bf16.
KILN_CPU_KERNEL("max_pool_forward", {[](CpuDevice& d, const OpCall& c) {
                                       if (c.in[0].dtype == DType::bf16) return run_pool_bf16(c, d.pool());
                                       max_pool_forward(attrs<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool());
                                     },
                                     nullptr, pool_workspace, pool_takes});
KILN_CPU_KERNEL("max_pool_backward", {[](CpuDevice& d, const OpCall& c) {
                                        if (c.in[0].dtype == DType::bf16) return run_pool_bf16(c, d.pool());
                                        max_pool_backward(attrs<PoolAttrs>(c), in(c, 0), in(c, 1), in(c, 2), out(c, 0),
                                                          d.pool());
                                      },
                                      nullptr, pool_workspace, pool_takes});
KILN_CPU_KERNEL("avg_pool_forward", {[](CpuDevice& d, const OpCall& c) {
                                       if (c.in[0].dtype == DType::bf16) return run_pool_bf16(c, d.pool());
                                       avg_pool_forward(attrs<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool());
                                     },
                                     nullptr, pool_workspace, pool_takes});
KILN_CPU_KERNEL("avg_pool_backward", {[](CpuDevice& d, const OpCall& c) {
                                        if (c.in[0].dtype == DType::bf16) return run_pool_bf16(c, d.pool());
                                        avg_pool_backward(attrs<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool());
                                      },
                                      nullptr, pool_workspace, pool_takes});

}  // namespace kiln::cpu
