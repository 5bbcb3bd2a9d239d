#version 450
// Batch norm's per-channel statistics over the elements [e0, e1) of channels [c0, c1), one workgroup per channel
// (a channel's element k is x[(k / inner * C + c) * inner + k % inner]). The host splits long channels over
// dispatches that accumulate (accumulate = 1) and finalizes on the last one, so each invocation stays within the
// loop budget at any length.
// mode 0: MEAN[c] (+)= sum x; finalize: MEAN[c] = total / m.
// mode 1: RSTD[c] (+)= sum (x - MEAN[c])^2; finalize: rstd = 1 / sqrt(total / m + eps), and the running statistics
//         move by momentum towards the batch's (the variance unbiased by m / (m - 1)).
// mode 2 (evaluation): MEAN = RMEAN, RSTD = 1 / sqrt(RVAR + eps).
#include "common.glsl"
#define WG_SIZE 256u
layout(local_size_x = 256) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RW(1, MEAN)
BUF_RW(2, RSTD)
BUF_RW(3, RMEAN)
BUF_RW(4, RVAR)
KILN_PUSH_BEGIN
  uint C; uint inner; uint c0; uint c1; uint e0; uint e1; uint mode; uint accumulate; uint finalize;
  float m; float eps; float momentum; float unbias;
KILN_PUSH_END
void main() {
  const uint lid = gl_LocalInvocationID.x;
  for (uint c = pc.c0 + gl_WorkGroupID.x; c < pc.c1; c += gl_NumWorkGroups.x) {
    if (pc.mode == 2u) {
      if (lid == 0u) {
        MEAN[pc.base1 + c] = RMEAN[pc.base3 + c];
        RSTD[pc.base2 + c] = 1.0 / sqrt(RVAR[pc.base4 + c] + pc.eps);
      }
      continue;
    }
    const float mu = pc.mode == 1u ? MEAN[pc.base1 + c] : 0.0;
    float s = 0.0;
    for (uint k = pc.e0 + lid; k < pc.e1; k += WG_SIZE) {
      const uint o = k / pc.inner;
      const float v = X[pc.base0 + (o * pc.C + c) * pc.inner + (k - o * pc.inner)];
      s += pc.mode == 1u ? (v - mu) * (v - mu) : v;
    }
    const float t = wg_sum(s);
    if (lid == 0u) {
      if (pc.mode == 0u) {
        const float tot = (pc.accumulate != 0u ? MEAN[pc.base1 + c] : 0.0) + t;
        MEAN[pc.base1 + c] = pc.finalize != 0u ? tot / pc.m : tot;
      } else {
        const float tot = (pc.accumulate != 0u ? RSTD[pc.base2 + c] : 0.0) + t;
        if (pc.finalize != 0u) {
          const float var = tot / pc.m;
          RSTD[pc.base2 + c] = 1.0 / sqrt(var + pc.eps);
          RMEAN[pc.base3 + c] = (1.0 - pc.momentum) * RMEAN[pc.base3 + c] + pc.momentum * mu;
          RVAR[pc.base4 + c] = (1.0 - pc.momentum) * RVAR[pc.base4 + c] + pc.momentum * var * pc.unbias;
        } else {
          RSTD[pc.base2 + c] = tot;
        }
      }
    }
  }
}
