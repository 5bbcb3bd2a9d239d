// The naive reference implementation of every op: the oracle of the conformance suite.
#pragma once
#include <cstdint>
#include <span>

#include "kiln/ops.hpp"

namespace kiln {

// Runs op `kind` on host buffers. in/out sizes must match op_arity(kind, attrs); throws kiln::Error if the
// number of buffers is wrong. Deliberately simple loops in double where it matters, no threads.
void reference_op(OpKind kind, const OpAttrs& attrs, std::span<const float* const> in, std::span<float* const> out);

// Counter-based RNG shared by every backend: 32-bit integer hashing only, so GLSL/CUDA produce the same bits.
inline uint32_t kiln_hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
// Uniform in [0, 1) with 24 random bits (exact in f32).
inline float dropout_uniform(uint32_t seed, uint32_t counter, uint32_t i) {
  uint32_t h = kiln_hash32(i ^ kiln_hash32(counter ^ kiln_hash32(seed)));
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

}  // namespace kiln
