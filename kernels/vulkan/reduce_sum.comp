#version 450
// y(o,i) = sum_r x(o,r,i), one invocation per output, r in order (for many outputs).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint outer; uint reduce; uint inner;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(idx, pc.outer * pc.inner) {
    const uint o = idx / pc.inner, i = idx % pc.inner;
    float acc = 0.0;
    for (uint r = 0u; r < pc.reduce; ++r) acc += X[pc.base0 + (o * pc.reduce + r) * pc.inner + i];
    Y[pc.base1 + idx] = acc;
  }
}
