#version 450
// PyTorch RMSprop: sq = rho*sq + (1-rho) g^2; with momentum > 0: buf = momentum*buf + g/(sqrt(sq)+eps),
// w -= lr*buf; else w -= lr*g/(sqrt(sq)+eps) and buf is untouched.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, G)
BUF_RW(1, Wv)
BUF_RW(2, SQ)
BUF_RW(3, BUF)
KILN_PUSH_BEGIN
  uint count; float lr; float rho; float eps; float momentum;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float g = G[pc.base0 + i];
    const float sq = pc.rho * SQ[pc.base2 + i] + (1.0 - pc.rho) * g * g;
    SQ[pc.base2 + i] = sq;
    const float step = g / (sqrt(sq) + pc.eps);
    if (pc.momentum > 0.0) {
      const float b = pc.momentum * BUF[pc.base3 + i] + step;
      BUF[pc.base3 + i] = b;
      Wv[pc.base1 + i] -= pc.lr * b;
    } else {
      Wv[pc.base1 + i] -= pc.lr * step;
    }
  }
}
