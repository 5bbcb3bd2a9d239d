#version 450
// dx = dy * f'(via y): relu y > 0 ? dy : 0; sigmoid dy*y*(1-y); tanh dy*(1-y*y). dx may alias dy.
#include "common.glsl"
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
    else dx = dy * (1.0 - y * y);
    DX[pc.base2 + i] = dx;
  }
}
