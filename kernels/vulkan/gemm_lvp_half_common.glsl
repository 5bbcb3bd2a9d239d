// Bindings and parameters of the gemm_lvp_h_*.comp kernels: the llvmpipe GEMM (gemm_lvp.glsl) reading A and B as
// float16 storage (f16vec4 loads, widened to float32 exactly; float32 accumulation), y float32 or, with y_half,
// float16 rounded to nearest even as kiln/half.hpp does (the same integer rounding as cast.comp: Vulkan leaves the
// rounding of a float16 conversion open). Otherwise as gemm_lvp_common.glsl; element offsets of A and B count
// float16 values (the binding bases count 32-bit words: times 2).
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#include "common.glsl"
layout(set = 0, binding = 0, std430) readonly buffer Buf0 { f16vec4 A4[]; };
layout(set = 0, binding = 1, std430) readonly buffer Buf1 { f16vec4 B4[]; };
layout(set = 0, binding = 2, std430) buffer Buf2 { float Y[]; };
layout(set = 0, binding = 2, std430) buffer Buf2h { uint16_t Yh[]; };
KILN_PUSH_BEGIN
  uint M; uint N; uint K; float alpha; float beta; uint kbegin; uint kend; uint batch0; uint sa; uint sb; uint sy;
  uint y_half;
KILN_PUSH_END

uint lvp_batch() { return pc.batch0 + gl_WorkGroupID.z; }
uint lvp_m() { return pc.M; }
uint lvp_n() { return pc.N; }
uint lvp_k() { return pc.K; }
uint lvp_kbegin() { return pc.kbegin; }
uint lvp_kend() { return pc.kend; }
uint lvp_a_base() { return 2u * pc.base0 + lvp_batch() * pc.sa; }
uint lvp_b_base() { return 2u * pc.base1 + lvp_batch() * pc.sb; }

uint lvp_to_f16(uint x) {  // cast.comp's to_f16
  const uint sign = (x >> 16) & 0x8000u;
  uint ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) {
    precise float r = uintBitsToFloat(ax) + 0.5;
    return sign | (floatBitsToUint(r) - 0x3f000000u);
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u);
  return sign | ((ax >> 13) & 0x7fffu);
}

float lvp_from_f16(uint h) {  // cast.comp's from_f16
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0u) return uintBitsToFloat(sign | floatBitsToUint(float(m) * 5.9604644775390625e-8));
  if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

void lvp_store(uint m, uint n, float acc) {
  const uint at = lvp_batch() * pc.sy + m * pc.N + n;
  float r = pc.alpha * acc;
  if (pc.y_half != 0u) {
    const uint i = 2u * pc.base2 + at;
    if (pc.beta != 0.0) r += pc.beta * lvp_from_f16(uint(Yh[i]));
    Yh[i] = uint16_t(lvp_to_f16(floatBitsToUint(r)));
  } else {
    const uint i = pc.base2 + at;
    if (pc.beta != 0.0) r += pc.beta * Y[i];
    Y[i] = r;
  }
}
#include "gemm_lvp.glsl"
