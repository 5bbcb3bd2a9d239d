#version 450
// dx(n0 + b, c, h, w) = sum over the taps (r, s) that reach (h, w) of col(b, (c, r, s), oh*OW + ow), where
// oh = h + ph - r and ow = w + pw - s (stride 1): the llvmpipe convolution's backward-data pass folds the product
// filters^T * dy (gemm_lvp, conv.cpp) back onto the image. One invocation per element of dx: x = 64-wide ranges
// of h*w (split into (h, w) through a float reciprocal, corrected), y = c, z = the image in the chunk. The loops
// over the taps run R*(S+1) counted iterations; the host checks that against the loop budget.
#include "common.glsl"
BUF_RO(0, Col)
BUF_WO(1, DX)
KILN_PUSH_BEGIN
  uint C; uint H; uint W; uint R; uint S; uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint n0; float inv_w;
KILN_PUSH_END
layout(local_size_x = 64) in;

void main() {
  const uint hw = pc.H * pc.W, p = gl_GlobalInvocationID.x;
  if (p >= hw) return;
  const uint c = gl_WorkGroupID.y, b = gl_WorkGroupID.z, ohw = pc.OH * pc.OW;
  uint h = uint(float(p) * pc.inv_w);
  if (h * pc.W > p) h -= 1u;
  else if ((h + 1u) * pc.W <= p) h += 1u;
  const uint w = p - h * pc.W;
  const uint row0 = (b * pc.C + c) * pc.R * pc.S;  // col row of (c, 0, 0)
  // Stride 1 only (the host's choice): tap (r, s) reaches (h, w) from output (h + ph - r, w + pw - s). The loops
  // have the same bounds in every lane (no divergent exits); taps outside the output are masked loads.
  const int oy0 = int(h + pc.PH), ox0 = int(w + pc.PW);
  float acc = 0.0;
  for (uint r = 0u; r < pc.R; ++r) {
    const int oh = oy0 - int(r);
    const bool yok = oh >= 0 && oh < int(pc.OH);
    for (uint s = 0u; s < pc.S; ++s) {
      const int ow = ox0 - int(s);
      if (yok && ow >= 0 && ow < int(pc.OW))
        acc += Col[pc.base0 + (row0 + r * pc.S + s) * ohw + uint(oh) * pc.OW + uint(ow)];
    }
  }
  DX[pc.base1 + ((pc.n0 + b) * pc.C + c) * hw + p] = acc;
}
