#version 450
// y[o,c,i] = x[o,c,i] + b[c]; y may alias x.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, Bv)
BUF_WO(2, Y)
KILN_PUSH_BEGIN
  uint count; uint channels; uint inner;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) Y[pc.base2 + i] = X[pc.base0 + i] + Bv[pc.base1 + (i / pc.inner) % pc.channels];
}
