#version 450
// y_b(M, N) = alpha * op(A_b) * op(B_b) + beta * y_b for the batch b = batch0 + gl_WorkGroupID.z; matrices stored
// one after another. The tile body is gemm_tile.glsl's, with z naming the batch instead of a K split: k_begin()
// cancels the tile's z * k_chunk() so every batch walks this dispatch's whole K range.
#include "common.glsl"
BUF_RO(0, A)
BUF_RO(1, B)
BUF_RW(2, Y)
KILN_PUSH_BEGIN
  uint M; uint N; uint K; uint trans_a; uint trans_b; float alpha; float beta; uint kchunk; uint kbegin; uint kend;
  uint batch0;
KILN_PUSH_END

uint batch() { return pc.batch0 + gl_WorkGroupID.z; }
uint tile_m() { return pc.M; }
uint tile_n() { return pc.N; }
uint tile_k() { return pc.K; }
uint k_chunk() { return pc.kchunk; }
uint k_begin() { return pc.kbegin - gl_WorkGroupID.z * pc.kchunk; }
uint k_end() { return pc.kend; }
bool a_m_fastest() { return pc.trans_a != 0u; }  // A_b stored (K, M)
bool b_n_fastest() { return pc.trans_b == 0u; }  // B_b stored (K, N)
float load_a(uint m, uint k, uint lm, uint lk) {
  const uint o = pc.base0 + batch() * pc.M * pc.K;
  return pc.trans_a != 0u ? A[o + k * pc.M + m] : A[o + m * pc.K + k];
}
float load_b(uint k, uint n, uint lk, uint ln) {
  const uint o = pc.base1 + batch() * pc.K * pc.N;
  return pc.trans_b != 0u ? B[o + n * pc.K + k] : B[o + k * pc.N + n];
}
void store_c(uint m, uint n, float acc) {
  const uint i = pc.base2 + batch() * pc.M * pc.N + m * pc.N + n;
  float r = pc.alpha * acc;
  if (pc.beta != 0.0) r += pc.beta * Y[i];
  Y[i] = r;
}
#include "gemm_tile.glsl"
