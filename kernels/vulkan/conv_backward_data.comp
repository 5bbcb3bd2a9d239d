#version 450
// dx(n,c,h,w) = sum_{k,r,s} dy(n,k,oy,ox) * w(k,c,r,s) over taps with oy*sh - ph + r = h (same for w), as an
// implicit GEMM: rows m = (n, h, w), columns = c, reduction = (k, r, s).
#include "common.glsl"
BUF_RO(0, DY)
BUF_RO(1, Wt)
BUF_WO(2, DX)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk;
KILN_PUSH_END

uint tile_m() { return pc.N * pc.H * pc.W; }
uint tile_n() { return pc.C; }
uint tile_k() { return pc.K * pc.R * pc.S; }
uint k_chunk() { return pc.kchunk; }
bool a_m_fastest() { return true; }
bool b_n_fastest() { return false; }
float load_a(uint m, uint kk) {
  const uint iw = m % pc.W, t = m / pc.W, ih = t % pc.H, n = t / pc.H;
  const uint s = kk % pc.S, t2 = kk / pc.S, r = t2 % pc.R, k = t2 / pc.R;
  const int ty = int(ih + pc.PH) - int(r), tx = int(iw + pc.PW) - int(s);
  if (ty < 0 || tx < 0 || uint(ty) % pc.SH != 0u || uint(tx) % pc.SW != 0u) return 0.0;
  const uint oy = uint(ty) / pc.SH, ox = uint(tx) / pc.SW;
  if (oy >= pc.OH || ox >= pc.OW) return 0.0;
  return DY[pc.base0 + ((n * pc.K + k) * pc.OH + oy) * pc.OW + ox];
}
float load_b(uint kk, uint c) {
  const uint rs = pc.R * pc.S;
  return Wt[pc.base1 + ((kk / rs) * pc.C + c) * rs + kk % rs];
}
void store_c(uint m, uint c, float acc) {
  const uint iw = m % pc.W, t = m / pc.W, ih = t % pc.H, n = t / pc.H;
  DX[pc.base2 + ((n * pc.C + c) * pc.H + ih) * pc.W + iw] = acc;
}
#include "gemm_tile.glsl"
