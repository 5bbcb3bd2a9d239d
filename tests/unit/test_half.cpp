// float32 <-> bfloat16/float16 conversions (kiln/half.hpp) against the CPU's own conversion instructions where it
// has them (F16C's vcvtps2ph/vcvtph2ps, AVX512_BF16's vcvtneps2bf16), over tens of millions of floats, and against
// hand-picked values whose right answer is known (ties, subnormals, the overflow boundary, NaN, infinities).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kiln/half.hpp"
#include "test_support.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KILN_TEST_X86 1
#endif

namespace {

using kiln::bf16_to_float;
using kiln::f16_to_float;
using kiln::float_to_bf16;
using kiln::float_to_f16;

float bits_f(uint32_t b) { return std::bit_cast<float>(b); }

bool f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// The floats the sweeps convert: every 16-bit value of the type exactly, the midpoints to its upper neighbour (ties)
// and the floats just either side of them, then `random` patterns of all 32 bits (subnormals, NaNs, infinities
// and everything between among them).
std::vector<uint32_t> sweep_inputs(bool f16, size_t random) {
  std::vector<uint32_t> v;
  v.reserve(random + 65536 * 4);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = f16 ? f16_to_float(static_cast<uint16_t>(h)) : bf16_to_float(static_cast<uint16_t>(h));
    const float y = f16 ? f16_to_float(static_cast<uint16_t>(h + 1)) : bf16_to_float(static_cast<uint16_t>(h + 1));
    const uint32_t xb = std::bit_cast<uint32_t>(x);
    v.push_back(xb);
    if (!std::isfinite(x) || !std::isfinite(y) || (h & 0x7fffu) == 0x7fffu) continue;
    const float mid = static_cast<float>((double(x) + double(y)) / 2);  // exact: one more bit than the type
    const uint32_t mb = std::bit_cast<uint32_t>(mid);
    v.push_back(mb);
    v.push_back(mb + 1);
    v.push_back(mb - 1);
  }
  std::mt19937 rng(20261128);
  for (size_t i = 0; i < random; ++i) v.push_back(static_cast<uint32_t>(rng()));
  return v;
}

#ifdef KILN_TEST_X86
__attribute__((target("f16c,avx"))) void hw_to_f16(const float* x, uint16_t* h, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c,avx"))) float hw_from_f16(uint16_t h) { return _cvtsh_ss(h); }

__attribute__((target("avx512f,avx512bf16"))) void hw_to_bf16(const float* x, uint16_t* h, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    std::memcpy(h + i, &r, sizeof r);
  }
  for (; i < n; ++i) {  // the tail through a padded vector
    float pad[16] = {};
    pad[0] = x[i];
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(pad));
    std::memcpy(h + i, &r, 2);
  }
}
#endif

}  // namespace

TEST_CASE("float16 conversion matches F16C vcvtps2ph round-to-nearest-even on tens of millions of floats",
          "[half][f16]") {
#ifndef KILN_TEST_X86
  KILN_SKIP("not an x86 CPU: no F16C to compare with");
#else
  // CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports knows no "f16c").
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 29))) KILN_SKIP("this CPU has no F16C");
  const std::vector<uint32_t> in = sweep_inputs(true, size_t(1) << 25);
  std::vector<float> x(in.size());
  for (size_t i = 0; i < in.size(); ++i) x[i] = bits_f(in[i]);
  std::vector<uint16_t> hw(in.size());
  hw_to_f16(x.data(), hw.data(), x.size());
  size_t bad = 0, nans = 0, subnormal = 0, overflow = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t mine = float_to_f16(x[i]);
    subnormal += (hw[i] & 0x7c00u) == 0 && (hw[i] & 0x3ffu) != 0;
    overflow += std::isfinite(x[i]) && (hw[i] & 0x7fffu) == 0x7c00u;
    if (std::isnan(x[i])) {
      // Both give a NaN of the input's sign; F16C also keeps the top of the payload, Kiln gives the quiet NaN.
      ++nans;
      if (!f16_nan(mine) || (mine & 0x8000u) != (hw[i] & 0x8000u)) ++bad;
      continue;
    }
    if (mine != hw[i] && ++bad <= 5)
      FAIL_CHECK("float " << std::hexfloat << x[i] << " (bits 0x" << std::hex << in[i] << "): kiln 0x" << mine
                          << ", F16C 0x" << hw[i]);
  }
  CHECK(bad == 0);
  CHECK(in.size() > 30000000);
  CHECK(nans > 1000);
  CHECK(subnormal > 1000);
  CHECK(overflow > 1000);
  // float16 to float32 is exact: all 65536 values (NaNs as NaNs of the same sign).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float mine = f16_to_float(static_cast<uint16_t>(h)), want = hw_from_f16(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(mine));
      REQUIRE(std::signbit(mine) == std::signbit(want));
    } else {
      REQUIRE(std::bit_cast<uint32_t>(mine) == std::bit_cast<uint32_t>(want));
    }
  }
#endif
}

TEST_CASE("bfloat16 conversion matches AVX512_BF16 vcvtneps2bf16 on tens of millions of floats", "[half][bf16]") {
#ifndef KILN_TEST_X86
  KILN_SKIP("not an x86 CPU: no AVX512_BF16 to compare with");
#else
  if (!__builtin_cpu_supports("avx512bf16")) KILN_SKIP("this CPU has no AVX512_BF16");
  const std::vector<uint32_t> in = sweep_inputs(false, size_t(1) << 25);
  std::vector<float> x(in.size());
  for (size_t i = 0; i < in.size(); ++i) x[i] = bits_f(in[i]);
  std::vector<uint16_t> hw(in.size());
  hw_to_bf16(x.data(), hw.data(), x.size());
  size_t bad = 0, compared = 0, nans = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    // vcvtneps2bf16 treats float32 subnormal inputs as zero; Kiln rounds them like any other float (checked by
    // hand below), as oneDNN's reference and PyTorch do.
    if ((in[i] & 0x7f800000u) == 0 && (in[i] & 0x7fffffu) != 0) continue;
    ++compared;
    const uint16_t mine = float_to_bf16(x[i]);
    if (std::isnan(x[i])) {
      ++nans;
      if (!bf16_nan(mine) || (mine & 0x8000u) != (hw[i] & 0x8000u)) ++bad;
      continue;
    }
    if (mine != hw[i] && ++bad <= 5)
      FAIL_CHECK("float " << std::hexfloat << x[i] << " (bits 0x" << std::hex << in[i] << "): kiln 0x" << mine
                          << ", AVX512_BF16 0x" << hw[i]);
  }
  CHECK(bad == 0);
  CHECK(compared > 30000000);
  CHECK(nans > 1000);
#endif
}

TEST_CASE("bfloat16 and float16 conversions of hand-picked values", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  // bfloat16: 8 significant bits. 1 + 2^-8 is the tie between 1 and 1 + 2^-7: to even (1); 1 + 3*2^-8 to even
  // (1 + 2^-6); just above a tie rounds up.
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(float_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.f)) == 0x3f81);
  CHECK(float_to_bf16(-2.5f) == 0xc020);
  CHECK(float_to_bf16(inf) == 0x7f80);
  CHECK(float_to_bf16(-inf) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up past the largest bfloat16
  CHECK(float_to_bf16(bits_f(0x7f7f7fffu)) == 0x7f7f);                // just below that tie: the largest
  CHECK(bf16_nan(float_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(bf16_nan(float_to_bf16(bits_f(0x7f800001u))));  // a signalling NaN whose payload is all in the low bits
  CHECK(float_to_bf16(bits_f(0x00010000u)) == 0x0001);  // subnormals round like the rest
  CHECK(float_to_bf16(bits_f(0x00018000u)) == 0x0002);  // a tie: to even
  CHECK(float_to_bf16(bits_f(0x007fffffu)) == 0x0080);  // the largest subnormal rounds to the smallest normal
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0x0001) == bits_f(0x00010000u));
  // float16: 11 significant bits, largest 65504; 65520 (the tie with 2^16) and above round to infinity.
  CHECK(float_to_f16(65504.f) == 0x7bff);
  CHECK(float_to_f16(std::nextafter(65520.f, 0.f)) == 0x7bff);
  CHECK(float_to_f16(65520.f) == 0x7c00);
  CHECK(float_to_f16(-65520.f) == 0xfc00);
  CHECK(float_to_f16(1e10f) == 0x7c00);
  CHECK(float_to_f16(inf) == 0x7c00);
  CHECK(f16_nan(float_to_f16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(f16_nan(float_to_f16(bits_f(0x7f800001u))));
  CHECK(float_to_f16(1.0f + 0x1p-11f) == 0x3c00);      // tie to even
  CHECK(float_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie to even (up)
  CHECK(float_to_f16(0x1p-24f) == 0x0001);             // the smallest subnormal
  CHECK(float_to_f16(0x1p-25f) == 0x0000);             // half of it: a tie, to even (zero)
  CHECK(float_to_f16(std::nextafter(0x1p-25f, 1.f)) == 0x0001);
  CHECK(float_to_f16(3 * 0x1p-25f) == 0x0002);         // 1.5 units: tie to even (2)
  CHECK(float_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);  // the tie below the smallest normal rounds up to it
  CHECK(float_to_f16(-0.0f) == 0x8000);
  CHECK(f16_to_float(0x7bff) == 65504.f);
  CHECK(f16_to_float(0x0001) == 0x1p-24f);
  CHECK(f16_to_float(0x83ff) == -1023 * 0x1p-24f);
  // round_to: a round trip, the identity for float32.
  CHECK(kiln::round_to(1.0f + 0x1p-9f, kiln::DType::bf16) == 1.0f);
  CHECK(kiln::round_to(1.0f + 0x1p-9f, kiln::DType::f16) == 1.0f + 0x1p-9f);
  CHECK(kiln::round_to(1.0f + 0x1p-20f, kiln::DType::f32) == 1.0f + 0x1p-20f);
}

TEST_CASE("bulk to_float and from_float agree with the scalar conversions", "[half]") {
  const std::vector<uint32_t> in = sweep_inputs(true, 1 << 20);
  std::vector<float> x(in.size());
  for (size_t i = 0; i < in.size(); ++i) x[i] = bits_f(in[i]);
  for (kiln::DType t : {kiln::DType::bf16, kiln::DType::f16}) {
    INFO(kiln::dtype_name(t));
    std::vector<uint16_t> h(x.size());
    kiln::from_float(x.data(), h.data(), t, x.size());
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += h[i] != kiln::float_to_half(x[i], t);
    CHECK(bad == 0);
    std::vector<float> back(x.size());
    kiln::to_float(h.data(), t, back.data(), h.size());
    bad = 0;
    for (size_t i = 0; i < x.size(); ++i)
      bad += std::bit_cast<uint32_t>(back[i]) != std::bit_cast<uint32_t>(kiln::half_to_float(h[i], t));
    CHECK(bad == 0);
  }
}
