#version 450
// y = x with permuted axes: y's element idx (y's shape ydims, last axis fastest) reads x at sum_i idx_i * step_i,
// step_i being the x stride of the axis that y's axis i came from. Over one range [begin, end) of y.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint rank; uint begin; uint end;
  uint d0; uint d1; uint d2; uint d3; uint d4; uint d5;
  uint s0; uint s1; uint s2; uint s3; uint s4; uint s5;
KILN_PUSH_END
void main() {
  const uint dims[6] = uint[6](pc.d0, pc.d1, pc.d2, pc.d3, pc.d4, pc.d5);
  const uint steps[6] = uint[6](pc.s0, pc.s1, pc.s2, pc.s3, pc.s4, pc.s5);
  FOR_EACH_INDEX_IN(idx, pc.begin, pc.end) {
    uint rest = idx, src = 0u;
    KILN_UNROLL for (int i = 5; i >= 0; --i) {
      if (uint(i) < pc.rank) {
        src += (rest % dims[i]) * steps[i];
        rest /= dims[i];
      }
    }
    Y[pc.base1 + idx] = X[pc.base0 + src];
  }
}
