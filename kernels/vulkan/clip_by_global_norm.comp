#version 450
// x *= min(1, max_norm / (sqrt(s) + 1e-6)) (PyTorch's clip_grad_norm_; a NaN coefficient stays NaN).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, S)
BUF_RW(1, X)
KILN_PUSH_BEGIN
  uint begin; uint end; float max_norm;
KILN_PUSH_END
void main() {
  float coef = pc.max_norm / (sqrt(S[pc.base0]) + 1e-6);
  coef = coef > 1.0 ? 1.0 : coef;
  FOR_EACH_INDEX_IN(i, pc.begin, pc.end) X[pc.base1 + i] *= coef;
}
