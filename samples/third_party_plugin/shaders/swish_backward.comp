#version 450
// swish backward: dx = dy * (s + x * s * (1 - s)), s = sigmoid(x).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, DY)
BUF_WO(2, DX)
KILN_PUSH_BEGIN
  uint count;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float x = X[pc.base0 + i];
    const float s = 1.0 / (1.0 + exp(-x));
    DX[pc.base2 + i] = DY[pc.base1 + i] * (s + x * s * (1.0 - s));
  }
}
