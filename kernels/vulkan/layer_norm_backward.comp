#version 450
// dx of layer norm for rows [r0, r1); one workgroup per row:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, xhat = (x - mean) * rstd.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, GAMMA)
BUF_RO(2, MEAN)
BUF_RO(3, RSTD)
BUF_RO(4, DY)
BUF_WO(5, DX)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  const float inv_c = 1.0 / float(pc.cols);
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint xo = pc.base0 + row * pc.cols, dyo = pc.base4 + row * pc.cols, dxo = pc.base5 + row * pc.cols;
    const float m = MEAN[pc.base2 + row], rs = RSTD[pc.base3 + row];
    float sg = 0.0, sgx = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) {
      const float g = DY[dyo + j] * GAMMA[pc.base1 + j];
      sg += g;
      sgx += g * (X[xo + j] - m) * rs;
    }
    const float mg = wg_sum(sg) * inv_c;
    const float mgx = wg_sum(sgx) * inv_c;
    for (uint j = lid; j < pc.cols; j += WG_SIZE)
      DX[dxo + j] = rs * (DY[dyo + j] * GAMMA[pc.base1 + j] - mg - (X[xo + j] - m) * rs * mgx);
  }
}
