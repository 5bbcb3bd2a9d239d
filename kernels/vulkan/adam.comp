#version 450
// PyTorch Adam with L2 weight decay; bc1 = 1 - beta1^t and bc2 = 1 - beta2^t come from the host. AdamW:
// keep = 1 - lr * decoupled_decay scales w first (keep = 1: plain Adam).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, G)
BUF_RW(1, Wv)
BUF_RW(2, Mv)
BUF_RW(3, Vv)
KILN_PUSH_BEGIN
  uint count; float lr; float beta1; float beta2; float eps; float weight_decay; float bc1; float bc2; float keep;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float w = pc.keep == 1.0 ? Wv[pc.base1 + i] : Wv[pc.base1 + i] * pc.keep;
    const float gp = G[pc.base0 + i] + pc.weight_decay * w;
    const float m = pc.beta1 * Mv[pc.base2 + i] + (1.0 - pc.beta1) * gp;
    const float v = pc.beta2 * Vv[pc.base3 + i] + (1.0 - pc.beta2) * gp * gp;
    Mv[pc.base2 + i] = m;
    Vv[pc.base3 + i] = v;
    Wv[pc.base1 + i] = w - pc.lr * (m / pc.bc1) / (sqrt(v / pc.bc2) + pc.eps);
  }
}
