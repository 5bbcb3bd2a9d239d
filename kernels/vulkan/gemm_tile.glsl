// A tiled shared-memory GEMM body: C(M, N) = A(M, K) * B(K, N), 64x64 output tiles per workgroup of 64
// invocations, each computing an 8x8 register block; K is walked in steps of 16 through shared memory.
// gl_WorkGroupID = (column tile, row tile, K split). The including kernel defines, before the include:
//   uint tile_m(), tile_n(), tile_k()             sizes (tile_k: the full K, for strides)
//   uint k_begin(), k_end(), k_chunk()            this dispatch's K range; split z (gl_WorkGroupID.z) walks
//                                                 [k_begin + z*k_chunk, min(k_end, k_begin + (z+1)*k_chunk))
//   bool a_m_fastest(), b_n_fastest()             which index is contiguous in memory (for coalesced loads)
//   float load_a(uint m, uint k, uint lm, uint lk), load_b(uint k, uint n, uint lk, uint ln)
//                                                 called only with in-range indices; l* are the indices inside
//                                                 the tile (m = row0 + lm, k = k0 + lk, n = col0 + ln)
//   void store_c(uint m, uint n, float acc)
// and, with KILN_TILE_HOOKS defined, two hooks every invocation calls (each followed by a barrier):
//   void tile_setup(uint row0, uint col0)         once per workgroup
//   void k_setup(uint k0)                         before loading each K step
// Convolutions use it as an implicit GEMM: their loaders gather image patches on the fly, with the index
// arithmetic (divisions) done once per tile row/column and K step in the hooks, not per loaded element.
// Loop budget (llvmpipe counts every loop iteration of an invocation, see common.glsl): the constant loops are
// unrolled, so an invocation runs one counted iteration per K step; the host keeps a dispatch's K range short.
#define TILE_M 64u
#define TILE_N 64u
#define TILE_K 16u
layout(local_size_x = 64) in;
shared float As[TILE_K][TILE_M];
shared float Bs[TILE_K][TILE_N];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint tx = tid % 8u, ty = tid / 8u;
  const uint M = tile_m(), N = tile_n(), K = tile_k();
  const uint row0 = gl_WorkGroupID.y * TILE_M, col0 = gl_WorkGroupID.x * TILE_N;
  const uint kb = k_begin() + gl_WorkGroupID.z * k_chunk();
  const uint ke = min(min(K, k_end()), kb + k_chunk());
  const bool am = a_m_fastest(), bn = b_n_fastest();
  float acc[8][8];
  KILN_UNROLL for (uint i = 0u; i < 8u; ++i)
    KILN_UNROLL for (uint j = 0u; j < 8u; ++j) acc[i][j] = 0.0;

#ifdef KILN_TILE_HOOKS
  tile_setup(row0, col0);
  barrier();
#endif
  for (uint k0 = kb; k0 < ke; k0 += TILE_K) {
#ifdef KILN_TILE_HOOKS
    k_setup(k0);
    barrier();
#endif
    KILN_UNROLL for (uint i = 0u; i < 16u; ++i) {
      const uint idx = tid + i * 64u;
      const uint ar = am ? idx % TILE_M : idx / TILE_K;
      const uint ak = am ? idx / TILE_M : idx % TILE_K;
      const uint gm = row0 + ar, gka = k0 + ak;
      As[ak][ar] = (gm < M && gka < ke) ? load_a(gm, gka, ar, ak) : 0.0;
      const uint bc = bn ? idx % TILE_N : idx / TILE_K;
      const uint bk = bn ? idx / TILE_N : idx % TILE_K;
      const uint gn = col0 + bc, gkb = k0 + bk;
      Bs[bk][bc] = (gn < N && gkb < ke) ? load_b(gkb, gn, bk, bc) : 0.0;
    }
    barrier();
    KILN_UNROLL for (uint kk = 0u; kk < TILE_K; ++kk) {
      float a[8], b[8];
      KILN_UNROLL for (uint i = 0u; i < 8u; ++i) a[i] = As[kk][ty + 8u * i];
      KILN_UNROLL for (uint j = 0u; j < 8u; ++j) b[j] = Bs[kk][tx + 8u * j];
      KILN_UNROLL for (uint i = 0u; i < 8u; ++i)
        KILN_UNROLL for (uint j = 0u; j < 8u; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
    barrier();
  }
  KILN_UNROLL for (uint i = 0u; i < 8u; ++i)
    KILN_UNROLL for (uint j = 0u; j < 8u; ++j) {
      const uint m = row0 + ty + 8u * i, n = col0 + tx + 8u * j;
      if (m < M && n < N) store_c(m, n, acc[i][j]);
    }
}
