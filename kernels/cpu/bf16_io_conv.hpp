// bf16 loads and stores for the convolution side's kernels (pool.cpp, batch_norm.cpp): bf16 storage, float32
// arithmetic. Written so that loops over them vectorize (no branch on the value: the NaN case is a select), and
// rounding to nearest even with NaN kept quiet, bit for bit kiln/half.hpp's float_to_bf16.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>

namespace kiln::cpu::bf16io {

inline float load(float v) { return v; }
inline float load(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = to_bf16(v); }

// n values between bf16 storage and float32.
inline void widen(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}
inline void narrow(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

}  // namespace kiln::cpu::bf16io
