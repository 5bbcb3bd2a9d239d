#version 450
// y(n,k,oh,ow) = sum_{c,r,s} x(n,c,oh*sh-ph+r, ow*sw-pw+s) * w(k,c,r,s), as an implicit GEMM:
// rows m = (n, oh, ow), columns = k, reduction = (c, r, s); patches are gathered while loading tiles.
#include "common.glsl"
BUF_RO(0, X)
BUF_RO(1, Wt)
BUF_WO(2, Y)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk;
KILN_PUSH_END

uint tile_m() { return pc.N * pc.OH * pc.OW; }
uint tile_n() { return pc.K; }
uint tile_k() { return pc.C * pc.R * pc.S; }
uint k_chunk() { return pc.kchunk; }
bool a_m_fastest() { return true; }
bool b_n_fastest() { return false; }
float load_a(uint m, uint kk) {
  const uint ow = m % pc.OW, t = m / pc.OW, oh = t % pc.OH, n = t / pc.OH;
  const uint s = kk % pc.S, t2 = kk / pc.S, r = t2 % pc.R, c = t2 / pc.R;
  const int iy = int(oh * pc.SH + r) - int(pc.PH), ix = int(ow * pc.SW + s) - int(pc.PW);
  if (iy < 0 || iy >= int(pc.H) || ix < 0 || ix >= int(pc.W)) return 0.0;
  return X[pc.base0 + ((n * pc.C + c) * pc.H + uint(iy)) * pc.W + uint(ix)];
}
float load_b(uint kk, uint k) { return Wt[pc.base1 + k * tile_k() + kk]; }
void store_c(uint m, uint k, float acc) {
  const uint ow = m % pc.OW, t = m / pc.OW, oh = t % pc.OH, n = t / pc.OH;
  Y[pc.base2 + ((n * pc.K + k) * pc.OH + oh) * pc.OW + ow] = acc;
}
#include "gemm_tile.glsl"
