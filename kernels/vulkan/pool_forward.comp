#version 450
// mode 0: max over the clipped window (padding never wins); mode 1: average over its valid elements.
// An empty window gives 0. One invocation per output.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_WO(1, Y)
#include "pool_common.glsl"
void main() {
  FOR_EACH_INDEX_IN(o, pc.i0, pc.i1) {
    const uint ox = o % pc.OW, oy = (o / pc.OW) % pc.OH, plane = o / (pc.OW * pc.OH);
    const uint xoff = pc.base0 + plane * pc.H * pc.W;
    int y0, y1, x0, x1;
    pool_window(oy, ox, y0, y1, x0, x1);
    float best = 0.0, sum = 0.0;
    bool found = false;
    for (int iy = y0; iy < y1; ++iy)
      for (int ix = x0; ix < x1; ++ix) {
        const float v = X[xoff + uint(iy) * pc.W + uint(ix)];
        if (!found || v > best) best = v;
        found = true;
        sum += v;
      }
    const int count = max(y1 - y0, 0) * max(x1 - x0, 0);
    Y[pc.base1 + o] = pc.mode == 0u ? best : (count > 0 ? sum / float(count) : 0.0);
  }
}
