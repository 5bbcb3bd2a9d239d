#version 450
// swish forward: y = x * sigmoid(x). y may alias x.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint count;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float x = X[pc.base0 + i];
    Y[pc.base1 + i] = x / (1.0 + exp(-x));
  }
}
