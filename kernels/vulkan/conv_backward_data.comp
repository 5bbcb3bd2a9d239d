#version 450
// dx(n,c,h,w) = sum_{k,r,s} dy(n,k,oy,ox) * w(k,c,r,s) over taps with oy*sh - ph + r = h (same for w), as an
// implicit GEMM: rows m = (n, h, w), columns = c, reduction = (k, r, s). A long reduction runs as several
// dispatches over ranges of (k, r, s); all but the first accumulate into dx.
#include "common.glsl"
BUF_RO(0, DY)
BUF_RO(1, Wt)
BUF_RW(2, DX)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk; uint kbegin; uint kend; uint accumulate;
KILN_PUSH_END

uint tile_m() { return pc.N * pc.H * pc.W; }
uint tile_n() { return pc.C; }
uint tile_k() { return pc.K * pc.R * pc.S; }
uint k_chunk() { return pc.kchunk; }
uint k_begin() { return pc.kbegin; }
uint k_end() { return pc.kend; }
bool a_m_fastest() { return true; }
bool b_n_fastest() { return false; }

// Row m: (offset of dy(n, 0, 0, 0), h + ph, w + pw); K index (k, r, s): (k*OH*OW, r, s, offset of w(k, 0, r, s)).
shared ivec3 row_dec[64];
shared ivec4 k_dec[16];
#define KILN_TILE_HOOKS
void tile_setup(uint row0, uint col0) {
  const uint t = gl_LocalInvocationID.x, m = row0 + t;
  if (m < tile_m()) {
    const uint iw = m % pc.W, q = m / pc.W, ih = q % pc.H, n = q / pc.H;
    row_dec[t] = ivec3(n * pc.K * pc.OH * pc.OW, ih + pc.PH, iw + pc.PW);
  }
}
void k_setup(uint k0) {
  const uint t = gl_LocalInvocationID.x, kk = k0 + t;
  if (t < 16u) {
    const uint rs = pc.R * pc.S, k = kk / rs, rem = kk % rs;
    k_dec[t] = ivec4(k * pc.OH * pc.OW, rem / pc.S, rem % pc.S, k * pc.C * rs + rem);
  }
}
float load_a(uint m, uint kk, uint lm, uint lk) {
  const ivec3 rd = row_dec[lm];
  const ivec4 kd = k_dec[lk];
  int oy = rd.y - kd.y, ox = rd.z - kd.z;  // oy*sh = h + ph - r
  if (oy < 0 || ox < 0) return 0.0;
  if (pc.SH != 1u) {
    if (uint(oy) % pc.SH != 0u) return 0.0;
    oy = int(uint(oy) / pc.SH);
  }
  if (pc.SW != 1u) {
    if (uint(ox) % pc.SW != 0u) return 0.0;
    ox = int(uint(ox) / pc.SW);
  }
  if (oy >= int(pc.OH) || ox >= int(pc.OW)) return 0.0;
  return DY[pc.base0 + uint(rd.x + kd.x + oy * int(pc.OW) + ox)];
}
float load_b(uint kk, uint c, uint lk, uint lc) { return Wt[pc.base1 + uint(k_dec[lk].w) + c * pc.R * pc.S]; }
void store_c(uint m, uint c, float acc) {
  const uint iw = m % pc.W, t = m / pc.W, ih = t % pc.H, n = t / pc.H;
  const uint i = pc.base2 + ((n * pc.C + c) * pc.H + ih) * pc.W + iw;
  DX[i] = pc.accumulate != 0u ? DX[i] + acc : acc;
}
#include "gemm_tile.glsl"
