#version 450
// y(o,i) = sum_r x(o,r,i), one workgroup per output and a tree sum (for few outputs with long reductions).
// Each dispatch sums r in [r0, r1) and, with accumulate, adds to y.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RW(1, Y)
KILN_PUSH_BEGIN
  uint outer; uint reduce; uint inner; uint r0; uint r1; uint accumulate; uint o0; uint o1;
KILN_PUSH_END
void main() {
  for (uint idx = pc.o0 + gl_WorkGroupID.x; idx < pc.o1; idx += gl_NumWorkGroups.x) {
    const uint o = idx / pc.inner, i = idx % pc.inner;
    float acc = 0.0;
    for (uint r = pc.r0 + gl_LocalInvocationID.x; r < pc.r1; r += WG_SIZE)
      acc += X[pc.base0 + (o * pc.reduce + r) * pc.inner + i];
    const float total = wg_sum(acc);
    if (gl_LocalInvocationID.x == 0u) Y[pc.base1 + idx] = pc.accumulate != 0u ? Y[pc.base1 + idx] + total : total;
  }
}
