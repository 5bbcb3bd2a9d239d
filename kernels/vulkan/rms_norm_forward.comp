#version 450
// RMSNorm over each row of cols values; one workgroup per row, rows [r0, r1): one pass for the mean of squares,
// one to write y = x * rstd * gamma.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, GAMMA)
BUF_WO(2, Y)
BUF_WO(3, RSTD)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1; float eps;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  const float inv_c = 1.0 / float(pc.cols);
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint xo = pc.base0 + row * pc.cols, yo = pc.base2 + row * pc.cols;
    float q = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) q += X[xo + j] * X[xo + j];
    const float rs = 1.0 / sqrt(wg_sum(q) * inv_c + pc.eps);
    for (uint j = lid; j < pc.cols; j += WG_SIZE) Y[yo + j] = X[xo + j] * rs * GAMMA[pc.base1 + j];
    if (lid == 0u) RSTD[pc.base3 + row] = rs;
  }
}
