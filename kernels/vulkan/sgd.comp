#version 450
// PyTorch SGD: g' = g + wd*w; v = momentum*v + g'; d = nesterov ? g' + momentum*v : v (d = g' and v untouched
// when momentum == 0); w -= lr*d.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, G)
BUF_RW(1, Wv)
BUF_RW(2, V)
KILN_PUSH_BEGIN
  uint count; float lr; float momentum; float weight_decay; uint nesterov;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float w = Wv[pc.base1 + i];
    const float gp = G[pc.base0 + i] + pc.weight_decay * w;
    float d = gp;
    if (pc.momentum != 0.0) {
      const float vn = pc.momentum * V[pc.base2 + i] + gp;
      V[pc.base2 + i] = vn;
      d = pc.nesterov != 0u ? gp + pc.momentum * vn : vn;
    }
    Wv[pc.base1 + i] = w - pc.lr * d;
  }
}
