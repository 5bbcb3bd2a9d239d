#version 450
// dx = rstd * (dy * gamma - mean(g) - xhat * mean(g * xhat)) over elements [begin, end) of x(n, C, inner), with
// mean(g) = gamma * dbeta / m and mean(g * xhat) = gamma * dgamma / m (batch_norm_param_grad.comp wrote dgamma and
// dbeta); evaluation (training = 0): dx = rstd * dy * gamma.
#include "common.glsl"
layout(local_size_x = 256) in;
BUF_RO(0, X)
BUF_RO(1, DY)
BUF_RO(2, GAMMA)
BUF_RO(3, MEAN)
BUF_RO(4, RSTD)
BUF_RO(5, DGAMMA)
BUF_RO(6, DBETA)
BUF_WO(7, DX)
KILN_PUSH_BEGIN
  uint C; uint inner; uint begin; uint end; float m; uint training;
KILN_PUSH_END
void main() {
  FOR_EACH_INDEX_IN(j, pc.begin, pc.end) {
    const uint c = (j / pc.inner) % pc.C;
    const float ga = GAMMA[pc.base2 + c], rs = RSTD[pc.base4 + c];
    const float mg = pc.training != 0u ? ga * DBETA[pc.base6 + c] / pc.m : 0.0;
    const float mgx = pc.training != 0u ? ga * DGAMMA[pc.base5 + c] / pc.m : 0.0;
    const float xhat = (X[pc.base0 + j] - MEAN[pc.base3 + c]) * rs;
    DX[pc.base7 + j] = rs * (DY[pc.base1 + j] * ga - mg - xhat * mgx);
  }
}
