#version 450
// dgamma[c] = sum_r dy(r, c) * x(r, c) * rstd(r) over rows [r0, r1), rows in order, for columns [c0, c1); with
// accumulate, added to what dgamma holds. The host splits rows and columns over dispatches so an invocation's
// loops stay within llvmpipe's loop budget.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, RSTD)
BUF_RO(2, DY)
BUF_RW(3, DGAMMA)
KILN_PUSH_BEGIN
  uint cols; uint r0; uint r1; uint c0; uint c1; uint accumulate;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(c, pc.c0, pc.c1) {
    float dg = pc.accumulate != 0u ? DGAMMA[pc.base3 + c] : 0.0;
    for (uint r = pc.r0; r < pc.r1; ++r)
      dg += DY[pc.base2 + r * pc.cols + c] * X[pc.base0 + r * pc.cols + c] * RSTD[pc.base1 + r];
    DGAMMA[pc.base3 + c] = dg;
  }
}
