#version 450
// y(n,k,oh,ow) = sum_{c,r,s} x(n,c,oh*sh-ph+r, ow*sw-pw+s) * w(k,c,r,s), as an implicit GEMM:
// rows m = (n, oh, ow), columns = k, reduction = (c, r, s); patches are gathered while loading tiles. A long
// reduction runs as several dispatches over ranges of (c, r, s); all but the first accumulate into y.
#include "common.glsl"
BUF_RO(0, X)
BUF_RO(1, Wt)
BUF_RW(2, Y)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk; uint kbegin; uint kend; uint accumulate;
KILN_PUSH_END

uint tile_m() { return pc.N * pc.OH * pc.OW; }
uint tile_n() { return pc.K; }
uint tile_k() { return pc.C * pc.R * pc.S; }
uint k_chunk() { return pc.kchunk; }
uint k_begin() { return pc.kbegin; }
uint k_end() { return pc.kend; }
bool a_m_fastest() { return true; }
bool b_n_fastest() { return false; }

// Row m of the tile: (image offset of x(n, 0, 0, 0), oh*sh - ph, ow*sw - pw); K index: (c*H*W, r, s).
shared ivec3 row_dec[64];
shared ivec3 k_dec[16];
#define KILN_TILE_HOOKS
void tile_setup(uint row0, uint col0) {
  const uint t = gl_LocalInvocationID.x, m = row0 + t;
  if (m < tile_m()) {
    const uint ow = m % pc.OW, q = m / pc.OW, oh = q % pc.OH, n = q / pc.OH;
    row_dec[t] = ivec3(n * pc.C * pc.H * pc.W, int(oh * pc.SH) - int(pc.PH), int(ow * pc.SW) - int(pc.PW));
  }
}
void k_setup(uint k0) {
  const uint t = gl_LocalInvocationID.x, kk = k0 + t;
  if (t < 16u) {
    const uint s = kk % pc.S, q = kk / pc.S, r = q % pc.R, c = q / pc.R;
    k_dec[t] = ivec3(c * pc.H * pc.W, r, s);
  }
}
float load_a(uint m, uint kk, uint lm, uint lk) {
  const ivec3 rd = row_dec[lm], kd = k_dec[lk];
  const int iy = rd.y + kd.y, ix = rd.z + kd.z;
  if (iy < 0 || iy >= int(pc.H) || ix < 0 || ix >= int(pc.W)) return 0.0;
  return X[pc.base0 + uint(rd.x + kd.x + iy * int(pc.W) + ix)];
}
float load_b(uint kk, uint k, uint lk, uint lk2) { return Wt[pc.base1 + k * tile_k() + kk]; }
void store_c(uint m, uint k, float acc) {
  const uint ow = m % pc.OW, t = m / pc.OW, oh = t % pc.OH, n = t / pc.OH;
  const uint i = pc.base2 + ((n * pc.K + k) * pc.OH + oh) * pc.OW + ow;
  Y[i] = pc.accumulate != 0u ? Y[i] + acc : acc;
}
#include "gemm_tile.glsl"
