#version 450
// y = (x - mean[c]) * rstd[c] * gamma[c] + beta[c] over elements [begin, end) of x(n, C, inner).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, GAMMA)
BUF_RO(2, BETA)
BUF_RO(3, MEAN)
BUF_RO(4, RSTD)
BUF_WO(5, Y)
KILN_PUSH_BEGIN
  uint C; uint inner; uint begin; uint end;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(j, pc.begin, pc.end) {
    const uint c = (j / pc.inner) % pc.C;
    Y[pc.base5 + j] = (X[pc.base0 + j] - MEAN[pc.base3 + c]) * RSTD[pc.base4 + c] * GAMMA[pc.base1 + c] + BETA[pc.base2 + c];
  }
}
