#version 450
// Row-wise softmax, max-subtracted; one workgroup per row. causal: row r keeps columns j <= r % cols, the others
// get 0 (attention's mask); the loops keep their length, so the loop budget is the plain softmax's.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_WO(1, Y)
KILN_PUSH_BEGIN
  uint rows; uint cols; uint r0; uint r1; uint causal;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
    const uint xo = pc.base0 + row * pc.cols, yo = pc.base1 + row * pc.cols;
    const uint valid = pc.causal != 0u ? row % pc.cols + 1u : pc.cols;
    float mx = -1.0 / 0.0;
    for (uint j = lid; j < valid; j += WG_SIZE) mx = max(mx, X[xo + j]);
    mx = wg_max(mx);
    float s = 0.0;
    for (uint j = lid; j < valid; j += WG_SIZE) s += exp(X[xo + j] - mx);
    s = wg_sum(s);
    for (uint j = lid; j < pc.cols; j += WG_SIZE) Y[yo + j] = j < valid ? exp(X[xo + j] - mx) / s : 0.0;
  }
}
