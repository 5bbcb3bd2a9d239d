#version 450
// y[i] = sum_z partial[z * count + i]: the second pass of a split-K GEMM (fixed order: deterministic).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, P)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint count; uint splits;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    float acc = 0.0;
    for (uint z = 0u; z < pc.splits; ++z) acc += P[pc.base0 + z * pc.count + i];
    Y[pc.base1 + i] = acc;
  }
}
