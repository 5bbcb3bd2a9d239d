#version 450
// y(o,i) = sum_r x(o,r,i), one invocation per output, r in order (for many outputs). Each dispatch sums
// r in [r0, r1) and, with accumulate, adds to y (the host splits long reductions: shader loops stay short).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RW(1, Y)
KILN_PUSH_BEGIN
  uint outer; uint reduce; uint inner; uint r0; uint r1; uint accumulate; uint o0; uint o1;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(idx, pc.o0, pc.o1) {
    const uint o = idx / pc.inner, i = idx % pc.inner;
    float acc = pc.accumulate != 0u ? Y[pc.base1 + idx] : 0.0;
    for (uint r = pc.r0; r < pc.r1; ++r) acc += X[pc.base0 + (o * pc.reduce + r) * pc.inner + i];
    Y[pc.base1 + idx] = acc;
  }
}
