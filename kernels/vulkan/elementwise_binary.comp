#version 450
// mode 0 (add): y = alpha*a + beta*b; mode 1 (mul): y = a*b. y may alias a or b.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, A)
BUF_RO(1, B)
BUF_WO(2, Y)
KILN_PUSH_BEGIN
  uint count; uint mode; float alpha; float beta;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX(i, pc.count) {
    const float a = A[pc.base0 + i], b = B[pc.base1 + i];
    precise float r;  // no contraction into fma: same rounding as the reference
    if (pc.mode == 0u) r = pc.alpha * a + pc.beta * b;
    else r = a * b;
    Y[pc.base2 + i] = r;
  }
}
