#version 450
// dgamma[c] = sum_r dy(r, c) * xhat(r, c) and dbeta[c] = sum_r dy(r, c) over rows [r0, r1), rows in order, for
// columns [c0, c1); with accumulate, added to what the outputs hold. The host splits rows and columns over
// dispatches so an invocation's loops stay within llvmpipe's loop budget (vulkan_ops.hpp).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, MEAN)
BUF_RO(2, RSTD)
BUF_RO(3, DY)
BUF_RW(4, DGAMMA)
BUF_RW(5, DBETA)
KILN_PUSH_BEGIN
  uint cols; uint r0; uint r1; uint c0; uint c1; uint accumulate; uint has_bias;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(c, pc.c0, pc.c1) {
    float dg = pc.accumulate != 0u ? DGAMMA[pc.base4 + c] : 0.0;
    float db = pc.accumulate != 0u && pc.has_bias != 0u ? DBETA[pc.base5 + c] : 0.0;
    for (uint r = pc.r0; r < pc.r1; ++r) {
      const float dy = DY[pc.base3 + r * pc.cols + c];
      dg += dy * (X[pc.base0 + r * pc.cols + c] - MEAN[pc.base1 + r]) * RSTD[pc.base2 + r];
      db += dy;
    }
    DGAMMA[pc.base4 + c] = dg;
    if (pc.has_bias != 0u) DBETA[pc.base5 + c] = db;
  }
}
