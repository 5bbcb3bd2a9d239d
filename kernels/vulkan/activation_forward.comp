#version 450
// y = f(x); act 0 relu (NaN passes through), 1 sigmoid, 2 tanh, 3 gelu, 4 gelu_tanh, 5 silu. y may alias x.
#include "common.glsl"
#include "activation.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint count; uint act;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float x = X[pc.base0 + i];
    float y;
    if (pc.act == 0u) {
      y = x < 0.0 ? 0.0 : x;
    } else if (pc.act == 1u) {
      y = 1.0 / (1.0 + exp(-x));
    } else if (pc.act == 2u) {  // tanh through exp(-2|x|), which cannot overflow
      const float t = exp(-2.0 * abs(x));
      y = sign(x) * (1.0 - t) / (1.0 + t);
    } else if (pc.act == 3u) {
      y = x * kiln_normal_cdf(x);
    } else if (pc.act == 4u) {
      y = x * kiln_gelu_tanh_sig(x);
    } else {
      y = x * kiln_sigmoid(x);
    }
    Y[pc.base1 + i] = y;
  }
}
