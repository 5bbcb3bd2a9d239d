#version 450
// Fused sparse softmax cross-entropy from logits, over the rows [r0, r1). mode 0: dlogits = scale*(softmax(x_r) -
// onehot(label_r)), one workgroup per row. mode 1: loss = scale * sum_r (lse_r - x_r[label_r]), one workgroup
// walking the rows in turn (each row reduced over its columns by the whole workgroup, so a row costs the same
// loop iterations as in mode 0; invocation r % 64 keeps row r's term, then a tree sum); with accumulate, added
// to the loss. Labels are class indices stored as floats; an out-of-range label gives a NaN loss. With soft != 0
// the labels are t(rows, cols), one-hot or class probabilities: dlogits = scale*(softmax(x_r)*sum(t_r) - t_r) and
// the row's loss term is sum_j t_rj (lse_r - x_rj), each a further workgroup reduction over the row.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, LABEL)
BUF_RW(2, LOSS)
BUF_WO(3, DX)
KILN_PUSH_BEGIN
  uint rows; uint cols; float scale; uint mode; uint r0; uint r1; uint accumulate; uint soft;
KILN_PUSH_END

int label_of(uint row) {
  const float lf = LABEL[pc.base1 + row];
  return (lf >= 0.0 && lf < float(pc.cols)) ? int(lf) : -1;
}

// log(sum_j exp(x_j)) of the row at xo; every invocation of the workgroup calls it.
float row_lse(uint xo) {
  const uint lid = gl_LocalInvocationID.x;
  float mx = -1.0 / 0.0;
  for (uint j = lid; j < pc.cols; j += WG_SIZE) mx = max(mx, X[xo + j]);
  mx = wg_max(mx);
  float s = 0.0;
  for (uint j = lid; j < pc.cols; j += WG_SIZE) s += exp(X[xo + j] - mx);
  return mx + log(wg_sum(s));
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  if (pc.mode == 0u) {
    for (uint row = pc.r0 + gl_WorkGroupID.x; row < pc.r1; row += gl_NumWorkGroups.x) {
      const uint xo = pc.base0 + row * pc.cols;
      const float lse = row_lse(xo);
      if (pc.soft != 0u) {
        const uint to = pc.base1 + row * pc.cols;
        float ts = 0.0;
        for (uint j = lid; j < pc.cols; j += WG_SIZE) ts += LABEL[to + j];
        ts = wg_sum(ts);
        for (uint j = lid; j < pc.cols; j += WG_SIZE)
          DX[pc.base3 + row * pc.cols + j] = pc.scale * (exp(X[xo + j] - lse) * ts - LABEL[to + j]);
        continue;
      }
      const int label = label_of(row);
      for (uint j = lid; j < pc.cols; j += WG_SIZE)
        DX[pc.base3 + row * pc.cols + j] = pc.scale * (exp(X[xo + j] - lse) - (int(j) == label ? 1.0 : 0.0));
    }
  } else {
    float total = 0.0;
    for (uint row = pc.r0; row < pc.r1; ++row) {
      const uint xo = pc.base0 + row * pc.cols;
      const float lse = row_lse(xo);
      if (pc.soft != 0u) {
        const uint to = pc.base1 + row * pc.cols;
        float term = 0.0;
        for (uint j = lid; j < pc.cols; j += WG_SIZE) term += LABEL[to + j] * (lse - X[xo + j]);
        term = wg_sum(term);
        if (row % WG_SIZE == lid) total += term;
        continue;
      }
      if (row % WG_SIZE == lid) {
        const int label = label_of(row);
        total += label >= 0 ? lse - X[xo + uint(label)] : kiln_nan();
      }
    }
    total = wg_sum(total);
    if (lid == 0u) LOSS[pc.base2] = pc.accumulate != 0u ? LOSS[pc.base2] + pc.scale * total : pc.scale * total;
  }
}
