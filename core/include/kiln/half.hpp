// Conversions between float32 and the 16-bit storage types, exact to IEEE 754 round-to-nearest-even (what
// PyTorch's .to(torch.bfloat16) / .half() and oneDNN's reorders give). Header-only: the reference, host reads of
// 16-bit tensors, and the CPU kernels' scalar tails use them.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>

#include "kiln/tensor.hpp"

namespace kiln {

inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and above round to infinity
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal (or zero); adding 0.5 puts the 2^-24 unit in the low bits
    const float r = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);  // rebias the exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (ax >> 13));
}
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t float_to_half(float f, DType t) { return t == DType::f16 ? float_to_f16(f) : float_to_bf16(f); }
inline float half_to_float(uint16_t h, DType t) { return t == DType::f16 ? f16_to_float(h) : bf16_to_float(h); }

// The value a float32 takes after a round trip through t (itself for f32): what the reference computes on.
inline float round_to(float f, DType t) { return t == DType::f32 ? f : half_to_float(float_to_half(f, t), t); }

// n values from storage of type `from` (raw bytes) to float32, and back.
void to_float(const void* src, DType from, float* dst, size_t n);
void from_float(const float* src, void* dst, DType to, size_t n);

}  // namespace kiln
