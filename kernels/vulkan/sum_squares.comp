#version 450
// y = alpha * sum x^2 over [r0, r1) (+ beta * y with accumulate): one workgroup, a fixed-order tree sum. The host
// runs long vectors in several dispatches that accumulate (the loop budget, common.glsl).
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RW(1, Y)
KILN_PUSH_BEGIN
  uint r0; uint r1; uint accumulate; float alpha; float beta;
KILN_PUSH_END
void main() {
  float acc = 0.0;
  for (uint r = pc.r0 + gl_LocalInvocationID.x; r < pc.r1; r += WG_SIZE) {
    const float v = X[pc.base0 + r];
    acc += v * v;
  }
  const float total = pc.alpha * wg_sum(acc);
  if (gl_LocalInvocationID.x == 0u) Y[pc.base1] = pc.accumulate != 0u ? pc.beta * Y[pc.base1] + total : total;
}
