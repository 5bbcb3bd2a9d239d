#version 450
// y[i] = sum_z partial[z * count + i], in order of z (deterministic), for i in [i0, i1): the second pass of a
// split-K reduction; with accumulate, added to y (a reduction longer than one pass of splits).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, P)
BUF_RW(1, Y)
KILN_PUSH_BEGIN
  uint i0; uint i1; uint count; uint splits; uint accumulate;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(i, pc.i0, pc.i1) {
    float acc = 0.0;
    for (uint z = 0u; z < pc.splits; ++z) acc += P[pc.base0 + z * pc.count + i];
    Y[pc.base1 + i] = pc.accumulate != 0u ? Y[pc.base1 + i] + acc : acc;
  }
}
