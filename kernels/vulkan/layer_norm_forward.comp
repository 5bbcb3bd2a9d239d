#version 450
// Layer norm over each row of cols values; one workgroup per row, rows [r0, r1). Two passes for the
// statistics (mean, then the sum of squared deviations), one to write y. has_bias: binding 2 holds beta.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, GAMMA)
BUF_RO(2, BETA)
BUF_WO(3, Y)
BUF_WO(4, MEAN)
BUF_WO(5, RSTD)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1; float eps; uint has_bias;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  const float inv_c = 1.0 / float(pc.cols);
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint xo = pc.base0 + row * pc.cols, yo = pc.base3 + row * pc.cols;
    float s = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) s += X[xo + j];
    const float m = wg_sum(s) * inv_c;
    float q = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) {
      const float d = X[xo + j] - m;
      q += d * d;
    }
    const float rs = 1.0 / sqrt(wg_sum(q) * inv_c + pc.eps);
    for (uint j = lid; j < pc.cols; j += WG_SIZE) {
      float y = (X[xo + j] - m) * rs * GAMMA[pc.base1 + j];
      if (pc.has_bias != 0u) y += BETA[pc.base2 + j];
      Y[yo + j] = y;
    }
    if (lid == 0u) {
      MEAN[pc.base4 + row] = m;
      RSTD[pc.base5 + row] = rs;
    }
  }
}
