#version 450
// dtable(v, j) = sum over r in [r0, r1) with ids[r] == v of dy(r, j), r in order, for table elements in [o0, o1);
// with accumulate, added to dtable. The host splits rows and elements over dispatches so an invocation's loops
// stay within llvmpipe's loop budget (vulkan_ops.hpp).
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, IDS)
BUF_RO(1, DY)
BUF_RW(2, DT)
KILN_PUSH_BEGIN
  uint vocab; uint dim; uint r0; uint r1; uint accumulate; uint o0; uint o1;
KILN_PUSH_END
void main() {
  for (uint idx = pc.o0 + gl_GlobalInvocationID.x; idx < pc.o1; idx += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint v = idx / pc.dim, j = idx % pc.dim;
    float acc = pc.accumulate != 0u ? DT[pc.base2 + idx] : 0.0;
    for (uint r = pc.r0; r < pc.r1; ++r)
      if (IDS[pc.base0 + r] == float(v)) acc += DY[pc.base1 + r * pc.dim + j];
    DT[pc.base2 + idx] = acc;
  }
}
