#version 450
// dx = y * (dy - sum_j dy_j y_j) per row; one workgroup per row.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, Yv)
BUF_RO(1, DY)
BUF_WO(2, DX)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint o = row * pc.cols;
    float dot = 0.0;
    for (uint j = lid; j < pc.cols; j += WG_SIZE) dot += DY[pc.base1 + o + j] * Yv[pc.base0 + o + j];
    dot = wg_sum(dot);
    for (uint j = lid; j < pc.cols; j += WG_SIZE)
      DX[pc.base2 + o + j] = Yv[pc.base0 + o + j] * (DY[pc.base1 + o + j] - dot);
  }
}
