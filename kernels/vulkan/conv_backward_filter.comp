#version 450
// dw(k,c,r,s) = sum_{n,oy,ox} dy(n,k,oy,ox) * x(n,c,oy*sh-ph+r, ox*sw-pw+s), as an implicit GEMM:
// rows = k, columns j = (c, r, s), reduction = (n, oy, ox). The reduction is long, so it is split over
// gl_WorkGroupID.z; with splits > 1, split z writes its partial sums to OUT + z*K*C*R*S (a workspace that
// splitk_reduce.comp sums), else OUT is dw itself.
#include "common.glsl"
BUF_RO(0, X)
BUF_RO(1, DY)
BUF_WO(2, OUT)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk;
KILN_PUSH_END

uint tile_m() { return pc.K; }
uint tile_n() { return pc.C * pc.R * pc.S; }
uint tile_k() { return pc.N * pc.OH * pc.OW; }
uint k_chunk() { return pc.kchunk; }
bool a_m_fastest() { return false; }
bool b_n_fastest() { return false; }
float load_a(uint k, uint kk) {
  const uint plane = pc.OH * pc.OW;
  return DY[pc.base1 + ((kk / plane) * pc.K + k) * plane + kk % plane];
}
float load_b(uint kk, uint j) {
  const uint ox = kk % pc.OW, t = kk / pc.OW, oy = t % pc.OH, n = t / pc.OH;
  const uint s = j % pc.S, t2 = j / pc.S, r = t2 % pc.R, c = t2 / pc.R;
  const int iy = int(oy * pc.SH + r) - int(pc.PH), ix = int(ox * pc.SW + s) - int(pc.PW);
  if (iy < 0 || iy >= int(pc.H) || ix < 0 || ix >= int(pc.W)) return 0.0;
  return X[pc.base0 + ((n * pc.C + c) * pc.H + uint(iy)) * pc.W + uint(ix)];
}
void store_c(uint k, uint j, float acc) {
  OUT[pc.base2 + gl_WorkGroupID.z * (tile_m() * tile_n()) + k * tile_n() + j] = acc;
}
#include "gemm_tile.glsl"
