#version 450
// dx(h, w) = sum of dy over the windows whose first (row-major) element equal to their output y is (h, w).
// Gathered per input element, windows visited in output order: the same additions as the reference scatter.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, Yv)
BUF_RO(2, DY)
BUF_WO(3, DX)
#include "pool_common.glsl"
void main() {
  FOR_EACH_INDEX_IN(idx, pc.i0, pc.i1) {
    const uint iw = idx % pc.W, ih = (idx / pc.W) % pc.H, plane = idx / (pc.W * pc.H);
    const uint xoff = pc.base0 + plane * pc.H * pc.W, yoff = plane * pc.OH * pc.OW;
    uint oy0, oy1, ox0, ox1;
    covering(ih, pc.SH, pc.PH, pc.KH, pc.OH, oy0, oy1);
    covering(iw, pc.SW, pc.PW, pc.KW, pc.OW, ox0, ox1);
    float acc = 0.0;
    for (uint oy = oy0; oy < oy1; ++oy)
      for (uint ox = ox0; ox < ox1; ++ox) {
        int y0, y1, x0, x1;
        pool_window(oy, ox, y0, y1, x0, x1);
        const uint o = yoff + oy * pc.OW + ox;
        const float yv = Yv[pc.base1 + o];
        bool mine = false, done = false;
        for (int iy = y0; iy < y1 && !done; ++iy)
          for (int ix = x0; ix < x1 && !done; ++ix)
            if (X[xoff + uint(iy) * pc.W + uint(ix)] == yv) {
              done = true;
              mine = uint(iy) == ih && uint(ix) == iw;
            }
        if (mine) acc += DY[pc.base2 + o];
      }
    DX[pc.base3 + idx] = acc;
  }
}
