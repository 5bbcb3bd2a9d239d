// kernels/cpu/bf16_io.hpp's in-loop conversions, compiled here as the CPU backend compiles them (AVX2/FMA): the
// AVX512_BF16 store (one vcvtneps2bf16, which flushes subnormals, so such vectors take the integer rounding) and the
// AVX2 integer store must both give kiln/half.hpp's float_to_bf16 bits, since the row kernels pick one or the other
// by the CPU they run on. Checked on every exponent with the mantissas where rounding turns (ties, one either side),
// NaNs, infinities, zeros and subnormals, in every lane, plus a strided sweep of all 2^32 patterns.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/half.hpp"
#include "test_support.hpp"

// tests/CMakeLists.txt compiles this file with the backend's -march (KILN_ARCH), so the header below takes the
// code paths the backend runs.
#include "../../kernels/cpu/bf16_io.hpp"
#include "../../kernels/cpu/bf16_rows.hpp"

namespace {

#ifdef __AVX2__
constexpr bool kAvx2 = true;
#else
constexpr bool kAvx2 = false;
#endif

using kiln::cpu::bf16;
using kiln::cpu::v8f;

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// The bit patterns the rounding can get wrong: for every sign and exponent, mantissas at and around the rounding
// point (low 16 bits 0x7fff, 0x8000, 0x8001 with the kept bit 0 and 1), the extremes, quiet and signalling NaNs.
std::vector<uint32_t> edge_patterns() {
  std::vector<uint32_t> p;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t m : {0x000000u, 0x000001u, 0x007fffu, 0x008000u, 0x008001u, 0x00ffffu, 0x017fffu, 0x018000u,
                         0x018001u, 0x3f8000u, 0x400000u, 0x7f0000u, 0x7f7fffu, 0x7f8000u, 0x7fffffu})
        p.push_back(sign | e << 23 | m);
  return p;
}

// Stores every pattern through store8_as<kCvt>, each in every lane of a vector of otherwise ordinary values (so a
// subnormal or NaN decides for its whole vector), and counts lanes whose bits differ from float_to_bf16's; *first
// gets the first such pattern.
template <bool kCvt>
int64_t mismatches(const std::vector<uint32_t>& patterns, uint32_t* first) {
  int64_t bad = 0;
  for (uint32_t u : patterns) {
    for (int lane = 0; lane < 8; ++lane) {
      alignas(32) float f[8] = {1.f, -2.5f, 3.0e-3f, 7.0e5f, -1.f, 0.f, 65504.f, 1.0e-30f};
      f[lane] = from_bits(u);
      bf16 out[8];
      kiln::cpu::store8_as<kCvt>(out, kiln::cpu::load8(f));
      for (int k = 0; k < 8; ++k) {
        if (out[k].bits != kiln::float_to_bf16(f[k])) {
          if (bad++ == 0) *first = std::bit_cast<uint32_t>(f[k]);
        }
      }
    }
  }
  return bad;
}

std::vector<uint32_t> sweep_patterns() {  // every 65,521st pattern (a prime stride: all low bits vary)
  std::vector<uint32_t> p;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) p.push_back(static_cast<uint32_t>(u));
  return p;
}

// The subnormal test store8_as relies on: exact on the edge patterns (the instruction alone flushes subnormals, so a
// store8_as that skipped it would fail mismatches<true>); returns the count of wrong answers.
int64_t no_subnormal8_errors(const std::vector<uint32_t>& patterns) {
  int64_t bad = 0;
  bad += kiln::cpu::no_subnormal8(kiln::cpu::splat8(from_bits(0x00012345u)));
  bad += !kiln::cpu::no_subnormal8(v8f{0.f, -0.f, 1.f, INFINITY, NAN, -1e-37f, 1.17549435e-38f, -3.4e38f});
  for (uint32_t u : patterns) {
    const bool subnormal = (u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0;
    v8f v = kiln::cpu::splat8(1.f);
    v[3] = from_bits(u);
    bad += kiln::cpu::no_subnormal8(v) == subnormal;
  }
  return bad;
}

// f32_to_bf16 (the staged kernels' commit), which takes store8_as<true> where the CPU has it: whole vectors and a
// tail; returns the count of values whose bits differ from float_to_bf16's.
int64_t f32_to_bf16_errors(const std::vector<uint32_t>& patterns) {
  std::vector<float> src;
  for (uint32_t u : patterns) src.push_back(from_bits(u));
  src.resize(src.size() / 8 * 8 + 5, 0.25f);
  std::vector<bf16> dst(src.size());
  kiln::cpu::f32_to_bf16(src.data(), dst.data(), static_cast<int64_t>(src.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < src.size(); ++i) bad += dst[i].bits != kiln::float_to_bf16(src[i]);
  return bad;
}

bool bf16_cvt() { return kiln::cpu::has_bf16_cvt(); }

// load16_eo, hsum8_tree, hmax8, load8_n and store8_n on small cases; returns the count of wrong answers.
int64_t helper_errors() {
  int64_t bad = 0;
  bf16 p[16];
  for (int k = 0; k < 16; ++k) p[k] = bf16{kiln::float_to_bf16(static_cast<float>(k) - 7.5f)};
  v8f even, odd;
  kiln::cpu::load16_eo(p, &even, &odd);
  for (int k = 0; k < 8; ++k) {
    bad += even[k] != static_cast<float>(2 * k) - 7.5f;
    bad += odd[k] != static_cast<float>(2 * k + 1) - 7.5f;
  }
  bad += kiln::cpu::hsum8_tree(v8f{1, 2, 3, 4, 5, 6, 7, 8}) != 36.f;
  for (int lane = 0; lane < 8; ++lane) {
    v8f v = kiln::cpu::splat8(-INFINITY);
    v[lane] = 3.f;
    bad += kiln::cpu::hmax8(v) != 3.f;
  }
  bf16 src[8], dst[8];  // partial vectors: nothing past n is read or written
  for (int k = 0; k < 8; ++k) src[k] = bf16{kiln::float_to_bf16(static_cast<float>(k + 1))}, dst[k] = bf16{0x7777};
  kiln::cpu::store8_n(dst, kiln::cpu::load8_n(src, 5) * 2.f, 5);
  for (int k = 0; k < 8; ++k)
    bad += dst[k].bits != (k < 5 ? kiln::float_to_bf16(2.f * static_cast<float>(k + 1)) : 0x7777);
  return bad;
}

// softmax_backward_row_io<kCvt> against softmax_backward_row_avx512 on rows of every length class (below, at and
// above 8, 16 and 32; ragged tails), a tenth of y subnormal-sized (their outputs take the integer rounding) and a
// fifth exactly zero; returns the count of rows whose dx bits differ, plus the count of rows of mixed-size values
// whose dot products (dot_bf16 against dot_bf16_avx512) differ.
template <bool kCvt>
int64_t softmax_backward_path_errors() {
#ifdef KILN_CPU_AVX512_ROWS
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  int64_t bad = 0;
  for (int64_t cols : {1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 257, 1000}) {
    const int64_t rows = 40, n = rows * cols;
    std::vector<bf16> y(n), dy(n), a(n), b(n);
    // Rows like softmax's: y positive summing to about 1, dy near 1, so dy - <dy, y> cancels and the outputs show
    // the dot product's last bits (a different summation order changes them).
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> p(static_cast<size_t>(cols));
      float sum = 0.f;
      for (auto& v : p) sum += v = std::abs(u(g)) + 0.01f;
      for (int64_t i = 0; i < cols; ++i) {
        const float yv = (i % 10 == 3 ? 1e-38f : 1.f) * p[static_cast<size_t>(i)] / sum;
        y[r * cols + i] = bf16{kiln::float_to_bf16(i % 5 == 0 ? 0.f : yv)};
        dy[r * cols + i] = bf16{kiln::float_to_bf16(1.f + std::round(u(g) * 4.f) / 128.f)};
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      kiln::cpu::softmax_backward_row_io<kCvt>(y.data() + r * cols, dy.data() + r * cols, a.data() + r * cols, cols);
      kiln::cpu::softmax_backward_row_avx512(y.data() + r * cols, dy.data() + r * cols, b.data() + r * cols, cols);
      bad += std::memcmp(a.data() + r * cols, b.data() + r * cols, static_cast<size_t>(cols) * sizeof(bf16)) != 0;
      // The dot products themselves, on values of mixed sizes (where the order of the sum shows in the last bits).
      std::vector<bf16> p(static_cast<size_t>(cols)), q(static_cast<size_t>(cols));
      for (int64_t i = 0; i < cols; ++i) {
        p[static_cast<size_t>(i)] = bf16{kiln::float_to_bf16(u(g) * std::ldexp(1.f, static_cast<int>(i % 17) - 8))};
        q[static_cast<size_t>(i)] = bf16{kiln::float_to_bf16(u(g))};
      }
      const float d2 = kiln::cpu::dot_bf16(p.data(), q.data(), cols);
      const float d5 = kiln::cpu::dot_bf16_avx512(p.data(), q.data(), cols);
      bad += std::bit_cast<uint32_t>(d2) != std::bit_cast<uint32_t>(d5);
    }
  }
  return bad;
#else
  return -1;
#endif
}

bool avx512_rows() {
#ifdef KILN_CPU_AVX512_ROWS
  return kiln::cpu::has_avx512_rows();
#else
  return false;
#endif
}

}  // namespace

TEST_CASE("bf16 softmax backward rows give the same bits through AVX2 and AVX-512", "[cpu][bf16][bf16_io]") {
  if (!kAvx2) KILN_SKIP("built without AVX2 (KILN_ARCH empty): the cpu backend's portable paths, not these");
  if (!avx512_rows()) KILN_SKIP("this CPU lacks AVX512F/BW/VL/DQ with AVX512_BF16");
  CHECK(softmax_backward_path_errors<false>() == 0);
  if (bf16_cvt()) CHECK(softmax_backward_path_errors<true>() == 0);
}

TEST_CASE("bf16 stores of the cpu row kernels round as float_to_bf16 on the AVX2 path", "[cpu][bf16][bf16_io]") {
  if (!kAvx2) KILN_SKIP("built without AVX2 (KILN_ARCH empty): the cpu backend's portable paths, not these");
  uint32_t first = 0;
  {
    const int64_t bad = mismatches<false>(edge_patterns(), &first);
    INFO("first wrong pattern 0x" << std::hex << first);
    CHECK(bad == 0);
  }
  {
    const int64_t bad = mismatches<false>(sweep_patterns(), &first);
    INFO("first wrong pattern 0x" << std::hex << first);
    CHECK(bad == 0);
  }
}

TEST_CASE("bf16 stores through AVX512_BF16 give the AVX2 path's bits, subnormals and NaNs included",
          "[cpu][bf16][bf16_io]") {
  if (!kAvx2) KILN_SKIP("built without AVX2 (KILN_ARCH empty): the cpu backend's portable paths, not these");
  if (!bf16_cvt()) KILN_SKIP("this CPU lacks AVX512_BF16 with AVX512VL (vcvtneps2bf16)");
  const auto edges = edge_patterns();
  uint32_t first = 0;
  {
    const int64_t bad = mismatches<true>(edges, &first);
    INFO("first wrong pattern 0x" << std::hex << first);
    CHECK(bad == 0);
  }
  {
    const int64_t bad = mismatches<true>(sweep_patterns(), &first);
    INFO("first wrong pattern 0x" << std::hex << first);
    CHECK(bad == 0);
  }
  CHECK(no_subnormal8_errors(edges) == 0);
  CHECK(f32_to_bf16_errors(edges) == 0);
}

TEST_CASE("bf16 even/odd loads and the tree reductions of the cpu row kernels", "[cpu][bf16][bf16_io]") {
  if (!kAvx2) KILN_SKIP("built without AVX2 (KILN_ARCH empty): the cpu backend's portable paths, not these");
  CHECK(helper_errors() == 0);
}
