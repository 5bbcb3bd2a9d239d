#version 450
// mode 0 (axpby): y = alpha*x + beta*y; mode 1 (scale): y = alpha*x; mode 2 (copy): y = x.
// y may alias x for scale and copy; y is read only by axpby.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RW(1, Y)
KILN_PUSH_BEGIN
  uint count; uint mode; float alpha; float beta;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float x = X[pc.base0 + i];
    precise float r;
    if (pc.mode == 0u) r = pc.alpha * x + pc.beta * Y[pc.base1 + i];
    else if (pc.mode == 1u) r = pc.alpha * x;
    else r = x;
    Y[pc.base1 + i] = r;
  }
}
