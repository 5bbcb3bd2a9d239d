// Bindings and parameters of the gemm_lvp_*.comp kernels (llvmpipe GEMM, gemm_lvp.glsl): y_b(M, N) = alpha *
// op(A_b) * op(B_b) + beta * y_b for the batch b = batch0 + gl_WorkGroupID.z (gemm: one batch), K over
// [kbegin, kend). Batch b's matrices start sa * b, sb * b, sy * b elements into A, B, y (sa = 0: one A for all,
// as the convolutions use it). A and B are read as vec4 (the host checked alignment); y is read only when
// beta != 0.
#include "common.glsl"
layout(set = 0, binding = 0, std430) readonly buffer Buf0 { vec4 A4[]; };
layout(set = 0, binding = 1, std430) readonly buffer Buf1 { vec4 B4[]; };
BUF_RW(2, Y)
KILN_PUSH_BEGIN
  uint M; uint N; uint K; float alpha; float beta; uint kbegin; uint kend; uint batch0; uint sa; uint sb; uint sy;
KILN_PUSH_END

uint lvp_batch() { return pc.batch0 + gl_WorkGroupID.z; }
uint lvp_m() { return pc.M; }
uint lvp_n() { return pc.N; }
uint lvp_k() { return pc.K; }
uint lvp_kbegin() { return pc.kbegin; }
uint lvp_kend() { return pc.kend; }
uint lvp_a_base() { return pc.base0 + lvp_batch() * pc.sa; }
uint lvp_b_base() { return pc.base1 + lvp_batch() * pc.sb; }
void lvp_store(uint m, uint n, float acc) {
  const uint i = pc.base2 + lvp_batch() * pc.sy + m * pc.N + n;
  float r = pc.alpha * acc;
  if (pc.beta != 0.0) r += pc.beta * Y[i];
  Y[i] = r;
}
#include "gemm_lvp.glsl"
