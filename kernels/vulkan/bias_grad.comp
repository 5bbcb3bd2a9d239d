#version 450
// db[c] = sum_{o,i} dy[o,c,i]: one workgroup per channel, a fixed-order tree sum. Each dispatch sums the
// flattened (o, i) range [j0, j1) for the channels [c0, c1) and, with accumulate, adds to db.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, DY)
BUF_RW(1, DB)
KILN_PUSH_BEGIN
  uint outer; uint channels; uint inner; uint j0; uint j1; uint accumulate; uint c0; uint c1;
KILN_PUSH_END
void main() {
  for (uint c = pc.c0 + gl_WorkGroupID.x; c < pc.c1; c += gl_NumWorkGroups.x) {
    float acc = 0.0;
    for (uint j = pc.j0 + gl_LocalInvocationID.x; j < pc.j1; j += WG_SIZE)
      acc += DY[pc.base0 + ((j / pc.inner) * pc.channels + c) * pc.inner + j % pc.inner];
    const float total = wg_sum(acc);
    if (gl_LocalInvocationID.x == 0u) DB[pc.base1 + c] = pc.accumulate != 0u ? DB[pc.base1 + c] + total : total;
  }
}
