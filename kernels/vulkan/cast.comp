#version 450
// Cast between float32 and the 16-bit storage types (bfloat16, float16) and between those two, rounding to nearest
// even exactly as kiln/half.hpp does (NaN stays NaN). The buffers are bound as 32-bit words and each invocation
// converts one word of 16-bit values (a pair of elements): a 16-bit tensor ends on a whole word (storage_bytes), so
// writing pairs never touches a neighbour's bytes, and no 16-bit store (with its device feature) is needed.
// The arithmetic is integer bit work (and one exact float add for float16 subnormals), so the result does not
// depend on a driver's float16 conversion instructions, whose rounding Vulkan leaves open.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(set = 0, binding = 0, std430) readonly buffer Buf0 { uint X[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Buf1 { uint Y[]; };
KILN_PUSH_BEGIN
  uint count; uint from; uint to; uint begin; uint end;  // DType codes: 0 float32, 1 bfloat16, 2 float16
KILN_PUSH_END

uint to_bf16(uint u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

uint to_f16(uint x) {
  const uint sign = (x >> 16) & 0x8000u;
  uint ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) {  // a subnormal or zero: adding 0.5 puts the 2^-24 unit in the low bits, rounded
    precise float r = uintBitsToFloat(ax) + 0.5;
    return sign | (floatBitsToUint(r) - 0x3f000000u);
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);
  return sign | ((ax >> 13) & 0x7fffu);
}

uint from_f16(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0u) return sign | floatBitsToUint(float(m) * 5.9604644775390625e-8);
  if (e == 31u) return sign | 0x7f800000u | (m << 13);
  return sign | ((e + 112u) << 23) | (m << 13);
}

// float32 bits -> 16-bit bits of type t, and back.
uint narrow(uint f, uint t) { return t == 2u ? to_f16(f) : to_bf16(f); }
uint widen(uint h, uint t) { return t == 2u ? from_f16(h) : h << 16; }

void main() {
  FOR_EACH_INDEX_IN(p, pc.begin, pc.end) {
    const uint i = 2u * p;
    const bool second = i + 1u < pc.count;
    if (pc.from == 0u) {
      const uint lo = narrow(X[pc.base0 + i], pc.to);
      const uint hi = second ? narrow(X[pc.base0 + i + 1u], pc.to) : 0u;
      Y[pc.base1 + p] = (lo & 0xffffu) | (hi << 16);
    } else {
      const uint w = X[pc.base0 + p];
      const uint lo = widen(w & 0xffffu, pc.from), hi = widen(w >> 16, pc.from);
      if (pc.to == 0u) {
        Y[pc.base1 + i] = lo;
        if (second) Y[pc.base1 + i + 1u] = hi;
      } else {
        Y[pc.base1 + p] = (narrow(lo, pc.to) & 0xffffu) | (second ? narrow(hi, pc.to) << 16 : 0u);
      }
    }
  }
}
