#version 450
// dw(k,c,r,s) = sum_{n,oy,ox} dy(n,k,oy,ox) * x(n,c,oy*sh-ph+r, ox*sw-pw+s), as an implicit GEMM:
// rows = k, columns j = (c, r, s), reduction = (n, oy, ox). The reduction is long, so it is split over
// gl_WorkGroupID.z; with splits > 1, split z writes its partial sums to OUT + z*K*C*R*S (a workspace that
// splitk_reduce.comp sums), else OUT is dw itself. Each dispatch covers [kbegin, kend) of the reduction; with
// accumulate (one split only) it adds to OUT.
#include "common.glsl"
BUF_RO(0, X)
BUF_RO(1, DY)
BUF_RW(2, OUT)
KILN_PUSH_BEGIN
  uint N; uint C; uint H; uint W; uint K; uint R; uint S;
  uint SH; uint SW; uint PH; uint PW; uint OH; uint OW; uint kchunk; uint kbegin; uint kend; uint accumulate;
KILN_PUSH_END

uint tile_m() { return pc.K; }
uint tile_n() { return pc.C * pc.R * pc.S; }
uint tile_k() { return pc.N * pc.OH * pc.OW; }
uint k_chunk() { return pc.kchunk; }
uint k_begin() { return pc.kbegin; }
uint k_end() { return pc.kend; }
bool a_m_fastest() { return false; }
bool b_n_fastest() { return false; }

// Column j = (c, r, s): (c*H*W, r - ph, s - pw). K index (n, oy, ox): (offset of x(n, 0, 0, 0), oy*sh, ox*sw,
// offset of dy(n, 0, oy, ox)).
shared ivec3 col_dec[64];
shared ivec4 k_dec[16];
#define KILN_TILE_HOOKS
void tile_setup(uint row0, uint col0) {
  const uint t = gl_LocalInvocationID.x, j = col0 + t;
  if (j < tile_n()) {
    const uint s = j % pc.S, q = j / pc.S, r = q % pc.R, c = q / pc.R;
    col_dec[t] = ivec3(c * pc.H * pc.W, int(r) - int(pc.PH), int(s) - int(pc.PW));
  }
}
void k_setup(uint k0) {
  const uint t = gl_LocalInvocationID.x, kk = k0 + t;
  if (t < 16u) {
    const uint plane = pc.OH * pc.OW, p = kk % plane, n = kk / plane, oy = p / pc.OW, ox = p % pc.OW;
    k_dec[t] = ivec4(n * pc.C * pc.H * pc.W, oy * pc.SH, ox * pc.SW, n * pc.K * plane + p);
  }
}
float load_a(uint k, uint kk, uint lk_row, uint lk) { return DY[pc.base1 + uint(k_dec[lk].w) + k * pc.OH * pc.OW]; }
float load_b(uint kk, uint j, uint lk, uint lj) {
  const ivec4 kd = k_dec[lk];
  const ivec3 cd = col_dec[lj];
  const int iy = kd.y + cd.y, ix = kd.z + cd.z;
  if (iy < 0 || iy >= int(pc.H) || ix < 0 || ix >= int(pc.W)) return 0.0;
  return X[pc.base0 + uint(kd.x + cd.x + iy * int(pc.W) + ix)];
}
void store_c(uint k, uint j, float acc) {
  const uint i = pc.base2 + gl_WorkGroupID.z * (tile_m() * tile_n()) + k * tile_n() + j;
  OUT[i] = pc.accumulate != 0u ? OUT[i] + acc : acc;
}
#include "gemm_tile.glsl"
