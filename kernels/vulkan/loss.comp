#version 450
// Fused MSE / binary cross-entropy over (rows, cols) with per = scale / cols.
// kind 0 MSE: term (p-t)^2, grad 2(p-t); kind 1 BCE from logits; kind 2 BCE from probabilities (clamped).
// mode 0: dpred = per * grad, elementwise; mode 1: loss = per * sum(term) over [i0, i1), one workgroup, added to
// loss with accumulate (the host splits long sums so shader loops stay short).
#include "common.glsl"
#define WG_SIZE 256u
layout(local_size_x = 256) in;
#include "reduce.glsl"
BUF_RO(0, P)
BUF_RO(1, T)
BUF_RW(2, LOSS)
BUF_WO(3, DP)
KILN_PUSH_BEGIN
  uint count; float per; uint kind; uint mode; uint i0; uint i1; uint accumulate;
KILN_PUSH_END

void term_grad(float p, float t, out float term, out float grad) {
  if (pc.kind == 0u) {
    term = (p - t) * (p - t);
    grad = 2.0 * (p - t);
  } else if (pc.kind == 1u) {
    term = max(p, 0.0) - p * t + log(1.0 + exp(-abs(p)));
    grad = 1.0 / (1.0 + exp(-p)) - t;
  } else {
    const float pc_ = clamp(p, 1e-7, 1.0 - 1e-7);
    term = -(t * log(pc_) + (1.0 - t) * log(1.0 - pc_));
    grad = (pc_ - t) / (pc_ * (1.0 - pc_));
  }
}

void main() {
  if (pc.mode == 0u) {
    FOR_EACH_INDEX(i, pc.count) {
      float term, grad;
      term_grad(P[pc.base0 + i], T[pc.base1 + i], term, grad);
      DP[pc.base3 + i] = pc.per * grad;
    }
  } else {
    // Each invocation sums up to ~32,000 terms: compensated (Kahan) so long sums keep f32 precision.
    precise float total = 0.0, lost = 0.0;
    for (uint i = pc.i0 + gl_LocalInvocationID.x; i < pc.i1; i += WG_SIZE) {
      float term, grad;
      term_grad(P[pc.base0 + i], T[pc.base1 + i], term, grad);
      precise const float y = term - lost;
      precise const float t = total + y;
      lost = (t - total) - y;
      total = t;
    }
    total = wg_sum(total);
    if (gl_LocalInvocationID.x == 0u)
      LOSS[pc.base2] = pc.accumulate != 0u ? LOSS[pc.base2] + pc.per * total : pc.per * total;
  }
}
