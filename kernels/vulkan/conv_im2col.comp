#version 450
// col(b, (c, r, s), p) = x(n0 + b, c, oh*sh - ph + r, ow*sw - pw + s) (0 outside the image), p = oh*OW + ow: the
// patch matrix of images n0.. for the llvmpipe convolution (conv.cpp), which multiplies it with gemm_lvp.
// One invocation per element, no loop: x = 64-wide ranges of p, y = (c, r, s), z = the image in the chunk. The
// row (c, r, s) is uniform per workgroup; p is split into (oh, ow) through a float reciprocal (p < 2^22, checked
// by the host) and corrected, so no vector integer division runs per element.
#include "common.glsl"
BUF_RO(0, X)
BUF_WO(1, Col)
KILN_PUSH_BEGIN
  uint C; uint H; uint W; uint R; uint S; uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint n0; float inv_ow;
KILN_PUSH_END
layout(local_size_x = 64) in;

void main() {
  const uint ohw = pc.OH * pc.OW, p = gl_GlobalInvocationID.x;
  if (p >= ohw) return;
  const uint crs = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint s = crs % pc.S, q = crs / pc.S, r = q % pc.R, c = q / pc.R;
  uint oh = uint(float(p) * pc.inv_ow);
  if (oh * pc.OW > p) oh -= 1u;
  else if ((oh + 1u) * pc.OW <= p) oh += 1u;
  const uint ow = p - oh * pc.OW;
  const int iy = int(oh * pc.SH + r) - int(pc.PH), ix = int(ow * pc.SW + s) - int(pc.PW);
  float v = 0.0;
  if (iy >= 0 && iy < int(pc.H) && ix >= 0 && ix < int(pc.W))
    v = X[pc.base0 + ((pc.n0 + b) * pc.C + c) * pc.H * pc.W + uint(iy) * pc.W + uint(ix)];
  Col[pc.base1 + (b * gl_NumWorkGroups.y + crs) * ohw + p] = v;
}
