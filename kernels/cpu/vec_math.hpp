// exp, sigmoid and tanh on 8-float vectors (GCC/Clang vector extensions, AVX2 with -march=x86-64-v3).
// Written as vector code because GCC 12 will not vectorize the scalar form: PRE turns the clamps into
// branches. Accurate to a few ulp; NaN in, NaN out; exp overflows to 88 -> 1.65e38 and underflows to ~0.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

using v8f = float __attribute__((vector_size(32)));
using v8u = uint32_t __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline v8f splat8(float s) { return v8f{} + s; }
inline float hsum8(v8f v) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

// Cephes-style expf: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n by exponent bits.
inline v8f exp8(v8f x) {
  x = x < -87.0f ? splat8(-87.0f) : x;
  x = x > 88.0f ? splat8(88.0f) : x;
  const v8f shifter = splat8(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const v8f t = x * 1.44269504088896341f + shifter;
  const v8f n = t - shifter;
  v8f r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v8u e = (std::bit_cast<v8u>(t) - std::bit_cast<v8u>(shifter) + 127u) << 23;
  return p * std::bit_cast<v8f>(e);
}

inline v8f sigmoid8(v8f x) { return 1.0f / (1.0f + exp8(-x)); }

// Odd polynomial near 0 (where 1 - e^-2|x| cancels), sign(x) (1 - e) / (1 + e) elsewhere.
inline v8f tanh8(v8f x) {
  const v8u bits = std::bit_cast<v8u>(x);
  const v8u abs_bits = bits & 0x7fffffffu;
  const v8f ax = std::bit_cast<v8f>(abs_bits);
  const v8f x2 = x * x;
  const v8f small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.053968254f)));
  const v8f e = exp8(-2.0f * ax);
  const v8f mag = (1.0f - e) / (1.0f + e);
  const v8u big_bits = std::bit_cast<v8u>(mag) | (bits & 0x80000000u);
  return ax < 0.125f ? small : std::bit_cast<v8f>(big_bits);
}

// erfc(|x|) by Numerical Recipes' Chebyshev fit (fractional error < 1.2e-7), for |x| >= 0.
inline v8f erfc_abs8(v8f ax) {
  const v8f t = 1.0f / (1.0f + 0.5f * ax);
  v8f p = t * 0.17087277f - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * exp8(p - ax * ax);
}
inline v8f abs8(v8f x) { return std::bit_cast<v8f>(std::bit_cast<v8u>(x) & 0x7fffffffu); }
// Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF, without cancellation in either tail.
inline v8f normal_cdf8(v8f x) {
  const v8f e = 0.5f * erfc_abs8(abs8(x) * 0.70710678118654752f);
  return x < 0.f ? e : 1.0f - e;
}
// Phi(x) for results stored as bf16 (2^-9 relative): Abramowitz & Stegun 7.1.26, erfc(z) = P(t) e^{-z^2} with
// t = 1 / (1 + 0.3275911 z), absolute error under 1.5e-7, so Phi is within 7.5e-8 absolute (under a bf16 rounding
// relative to Phi for x >= -4; gelu there is below 1.3e-4 in size). Its e^{-x^2/2} is the normal density's too, so
// gelu's gradient takes one exp instead of two. Sets *e = exp(-x^2 / 2).
inline v8f normal_cdf_bf16_8(v8f x, v8f* e) {
  const v8f z = abs8(x) * 0.70710678118654752f;
  const v8f t = 1.0f / (1.0f + 0.3275911f * z);
  v8f p = t * 1.061405429f - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  *e = exp8(-(z * z));
  const v8f half = 0.5f * (p * t) * *e;
  return x < 0.f ? half : 1.0f - half;
}
inline v8f gelu_bf16_8(v8f x) {
  v8f e;
  return x * normal_cdf_bf16_8(x, &e);
}
inline v8f gelu_grad_bf16_8(v8f x) {
  v8f e;
  const v8f cdf = normal_cdf_bf16_8(x, &e);
  return cdf + x * 0.39894228040143268f * e;
}
// GELU and its input gradient factor; gelu_tanh as x * sigmoid(2u), 1 + tanh(u) = 2 sigmoid(2u) (no cancellation).
inline v8f gelu8(v8f x) { return x * normal_cdf8(x); }
inline v8f gelu_grad8(v8f x) { return normal_cdf8(x) + x * 0.39894228040143268f * exp8(-0.5f * x * x); }
inline v8f gelu_tanh_sig8(v8f x) { return sigmoid8(2.0f * 0.79788456080286536f * (x + 0.044715f * x * x * x)); }
inline v8f gelu_tanh8(v8f x) { return x * gelu_tanh_sig8(x); }
// Derivatives through e = exp(-z), s = 1 / (1 + e): s (1 - s) = e s^2, free of the cancellation in 1 - s.
inline v8f gelu_tanh_grad8(v8f x) {
  const v8f e = exp8(-2.0f * 0.79788456080286536f * (x + 0.044715f * x * x * x));
  const v8f s = 1.0f / (1.0f + e);
  return s + 2.0f * x * (e * s * s) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
}
inline v8f silu8(v8f x) { return x * sigmoid8(x); }
inline v8f silu_grad8(v8f x) {
  const v8f e = exp8(-x);
  const v8f s = 1.0f / (1.0f + e);
  return s + x * (e * s * s);
}

// y[i] = f(x[i]) * dy[i] for i < n, vector by vector (dx may equal dy).
template <class F>
inline void map8_times(const float* x, const float* dy, float* dx, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(dx + i, f(load8(x + i)) * load8(dy + i));
  if (i < n) {
    float bx[8] = {}, bd[8] = {};
    std::memcpy(bx, x + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(bd, dy + i, static_cast<size_t>(n - i) * sizeof(float));
    store8(bd, f(load8(bx)) * load8(bd));
    std::memcpy(dx + i, bd, static_cast<size_t>(n - i) * sizeof(float));
  }
}

inline float exp_approx(float x) { return exp8(splat8(x))[0]; }
inline float sigmoid_approx(float x) { return sigmoid8(splat8(x))[0]; }

// y[i] = f(x)[i] for i < n: whole vectors, then the tail through a zero-padded vector. y may equal x.
template <class F>
inline void map8(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, f(load8(x + i)));
  if (i < n) {
    float buf[8] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    store8(buf, f(load8(buf)));
    std::memcpy(y + i, buf, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// y[j] = exp(x[j] - shift) for j < n; returns the sum of the y[j]. y may equal x.
inline float exp_shift_sum(const float* x, float shift, float* y, int64_t n) {
  v8f acc = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const v8f e = exp8(load8(x + j) - shift);
    store8(y + j, e);
    acc += e;
  }
  float sum = hsum8(acc);
  if (j < n) {
    float buf[8] = {};
    std::memcpy(buf, x + j, static_cast<size_t>(n - j) * sizeof(float));
    store8(buf, exp8(load8(buf) - shift));
    for (int64_t k = 0; k < n - j; ++k) {
      y[j + k] = buf[k];
      sum += buf[k];
    }
  }
  return sum;
}

}  // namespace kiln::cpu
