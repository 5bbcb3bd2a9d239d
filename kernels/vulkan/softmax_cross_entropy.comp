#version 450
// Fused sparse softmax cross-entropy from logits. mode 0: dlogits = scale*(softmax(x_r) - onehot(label_r)),
// one workgroup per row. mode 1: loss = scale * sum_r (lse_r - x_r[label_r]), one workgroup, rows strided
// over invocations. Labels are class indices stored as floats; an out-of-range label gives a NaN loss.
#include "common.glsl"
#define WG_SIZE 64u
layout(local_size_x = 64) in;
#include "reduce.glsl"
BUF_RO(0, X)
BUF_RO(1, LABEL)
BUF_WO(2, LOSS)
BUF_WO(3, DX)
KILN_PUSH_BEGIN
  uint rows; uint cols; float scale; uint mode;
KILN_PUSH_END

int label_of(uint row) {
  const float lf = LABEL[pc.base1 + row];
  return (lf >= 0.0 && lf < float(pc.cols)) ? int(lf) : -1;
}

void main() {
  const uint lid = gl_LocalInvocationID.x;
  if (pc.mode == 0u) {
    for (uint row = gl_WorkGroupID.x; row < pc.rows; row += gl_NumWorkGroups.x) {
      const uint xo = pc.base0 + row * pc.cols;
      float mx = -1.0 / 0.0;
      for (uint j = lid; j < pc.cols; j += WG_SIZE) mx = max(mx, X[xo + j]);
      mx = wg_max(mx);
      float s = 0.0;
      for (uint j = lid; j < pc.cols; j += WG_SIZE) s += exp(X[xo + j] - mx);
      const float lse = mx + log(wg_sum(s));
      const int label = label_of(row);
      for (uint j = lid; j < pc.cols; j += WG_SIZE)
        DX[pc.base3 + row * pc.cols + j] = pc.scale * (exp(X[xo + j] - lse) - (int(j) == label ? 1.0 : 0.0));
    }
  } else {
    float total = 0.0;
    for (uint row = lid; row < pc.rows; row += WG_SIZE) {
      const uint xo = pc.base0 + row * pc.cols;
      float mx = -1.0 / 0.0;
      for (uint j = 0u; j < pc.cols; ++j) mx = max(mx, X[xo + j]);
      float s = 0.0;
      for (uint j = 0u; j < pc.cols; ++j) s += exp(X[xo + j] - mx);
      const int label = label_of(row);
      total += label >= 0 ? mx + log(s) - X[xo + uint(label)] : kiln_nan();
    }
    total = wg_sum(total);
    if (lid == 0u) LOSS[pc.base2] = pc.scale * total;
  }
}
