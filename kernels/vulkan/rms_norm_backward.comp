#version 450
// dx of RMSNorm for rows [r0, r1); one workgroup per row:
// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, GAMMA)
BUF_RO(2, RSTD)
BUF_RO(3, DY)
BUF_WO(4, DX)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  const float inv_c = 1.0 / float(pc.cols);
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint xo = pc.base0 + row * pc.cols, dyo = pc.base3 + row * pc.cols, dxo = pc.base4 + row * pc.cols;
    const float rs = RSTD[pc.base2 + row];
    float sgx = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) sgx += DY[dyo + j] * GAMMA[pc.base1 + j] * X[xo + j] * rs;
    const float mgx = wg_sum(sgx) * inv_c;
    for (uint j = lid; j < pc.cols; j += WG_SIZE)
      DX[dxo + j] = rs * (DY[dyo + j] * GAMMA[pc.base1 + j] - X[xo + j] * rs * mgx);
  }
}
