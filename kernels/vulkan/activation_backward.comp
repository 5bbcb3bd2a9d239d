#version 450
// dx = dy * f'. relu, sigmoid and tanh read the forward output y: relu y > 0 ? dy : 0; sigmoid dy*y*(1-y);
// tanh dy*(1-y*y). gelu, gelu_tanh and silu (act 3..5) read the forward input x. dx may alias dy.
#include "common.glsl"
#include "activation.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, Yv)
BUF_RO(1, DY)
BUF_WO(2, DX)
KILN_PUSH_BEGIN
  uint count; uint act;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float y = Yv[pc.base0 + i], dy = DY[pc.base1 + i];
    float dx;
    if (pc.act == 0u) dx = y > 0.0 ? dy : 0.0;
    else if (pc.act == 1u) dx = dy * y * (1.0 - y);
    else if (pc.act == 2u) dx = dy * (1.0 - y * y);
    else if (pc.act == 3u) dx = dy * (kiln_normal_cdf(y) + y * 0.39894228040143268 * exp(-0.5 * y * y));
    else if (pc.act == 4u) {  // s (1 - s) = e s^2 with e = exp(-z): no cancellation in 1 - s
      const float e = exp(-2.0 * 0.79788456080286536 * (y + 0.044715 * y * y * y)), s = 1.0 / (1.0 + e);
      dx = dy * (s + 2.0 * y * (e * s * s) * 0.79788456080286536 * (1.0 + 3.0 * 0.044715 * y * y));
    } else {
      const float e = exp(-y), s = 1.0 / (1.0 + e);
      dx = dy * (s + y * (e * s * s));
    }
    DX[pc.base2 + i] = dx;
  }
}
