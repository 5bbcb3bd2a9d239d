// Branch-free float math that GCC vectorizes (AVX2/FMA): exp, sigmoid, tanh. Accurate to a few ulp; NaN in,
// NaN out. libm's expf would keep the loops scalar.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace kiln::cpu {

// Cephes-style expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by exponent bits.
// Inputs are clamped to [-87, 88] (exp(88) ~ 1.65e38 stands in for overflow).
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t e = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(shifter) + 127u) << 23;
  return p * std::bit_cast<float>(e);
}

inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// Odd polynomial near 0 (where 1 - e^-2|x| cancels), (1 - e) / (1 + e) elsewhere.
inline float tanh_approx(float x) {
  const float ax = std::fabs(x);
  const float x2 = x * x;
  const float small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.053968254f)));
  const float e = exp_approx(-2.0f * ax);
  const float big = std::copysign((1.0f - e) / (1.0f + e), x);
  return ax < 0.125f ? small : big;
}

}  // namespace kiln::cpu
