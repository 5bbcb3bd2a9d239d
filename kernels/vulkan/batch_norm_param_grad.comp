#version 450
// dgamma[c] (+)= sum dy * (x - mean[c]) * rstd[c] and dbeta[c] (+)= sum dy over the elements [e0, e1) of channels
// [c0, c1), one workgroup per channel (element k of a channel as in batch_norm_stats.comp); the host splits long
// channels over dispatches that accumulate.
#include "common.glsl"
#define WG_SIZE 256u
layout(local_size_x = 256) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, DY)
BUF_RO(2, MEAN)
BUF_RO(3, RSTD)
BUF_RW(4, DGAMMA)
BUF_RW(5, DBETA)
KILN_PUSH_BEGIN
  uint C; uint inner; uint c0; uint c1; uint e0; uint e1; uint accumulate;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  for (uint c = pc.c0 + gl_WorkGroupID.x; c < pc.c1; c += gl_NumWorkGroups.x) {
    const float mu = MEAN[pc.base2 + c], rs = RSTD[pc.base3 + c];
    float sg = 0.0, sb = 0.0;
    for (uint k = pc.e0 + lid; k < pc.e1; k += WG_SIZE) {
      const uint o = k / pc.inner;
      const uint j = (o * pc.C + c) * pc.inner + (k - o * pc.inner);
      const float dy = DY[pc.base1 + j];
      sg += dy * (X[pc.base0 + j] - mu) * rs;
      sb += dy;
    }
    const float tg = wg_sum(sg);
    const float tb = wg_sum(sb);
    if (lid == 0u) {
      DGAMMA[pc.base4 + c] = (pc.accumulate != 0u ? DGAMMA[pc.base4 + c] : 0.0) + tg;
      DBETA[pc.base5 + c] = (pc.accumulate != 0u ? DBETA[pc.base5 + c] : 0.0) + tb;
    }
  }
}
