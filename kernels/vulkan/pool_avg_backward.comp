#version 450
// dx(h, w) = sum over the windows containing (h, w) of dy / (valid elements of the window).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, DY)
BUF_WO(1, DX)
#include "pool_common.glsl"
void main() {
  FOR_EACH_INDEX_IN(idx, pc.i0, pc.i1) {
    const uint iw = idx % pc.W, ih = (idx / pc.W) % pc.H, plane = idx / (pc.W * pc.H);
    const uint yoff = plane * pc.OH * pc.OW;
    uint oy0, oy1, ox0, ox1;
    covering(ih, pc.SH, pc.PH, pc.KH, pc.OH, oy0, oy1);
    covering(iw, pc.SW, pc.PW, pc.KW, pc.OW, ox0, ox1);
    float acc = 0.0;
    for (uint oy = oy0; oy < oy1; ++oy)
      for (uint ox = ox0; ox < ox1; ++ox) {
        int y0, y1, x0, x1;
        pool_window(oy, ox, y0, y1, x0, x1);
        const int count = max(y1 - y0, 0) * max(x1 - x0, 0);
        if (count > 0) acc += DY[pc.base0 + yoff + oy * pc.OW + ox] / float(count);
      }
    DX[pc.base1 + idx] = acc;
  }
}
