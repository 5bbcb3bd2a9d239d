#version 450
// y(M, N) = alpha * op(A) * op(B) + beta * y; y is read only when beta != 0.
#include "common.glsl"
BUF_RO(0, A)
BUF_RO(1, B)
BUF_RW(2, Y)
KILN_PUSH_BEGIN
  uint M; uint N; uint K; uint trans_a; uint trans_b; float alpha; float beta; uint kchunk; uint kbegin; uint kend;
KILN_PUSH_END

uint tile_m() { return pc.M; }
uint tile_n() { return pc.N; }
uint tile_k() { return pc.K; }
uint k_chunk() { return pc.kchunk; }
uint k_begin() { return pc.kbegin; }
uint k_end() { return pc.kend; }
bool a_m_fastest() { return pc.trans_a != 0u; }  // A stored (K, M)
bool b_n_fastest() { return pc.trans_b == 0u; }  // B stored (K, N)
float load_a(uint m, uint k, uint lm, uint lk) { return pc.trans_a != 0u ? A[pc.base0 + k * pc.M + m] : A[pc.base0 + m * pc.K + k]; }
float load_b(uint k, uint n, uint lk, uint ln) { return pc.trans_b != 0u ? B[pc.base1 + n * pc.K + k] : B[pc.base1 + k * pc.N + n]; }
void store_c(uint m, uint n, float acc) {
  const uint i = pc.base2 + m * pc.N + n;
  float r = pc.alpha * acc;
  if (pc.beta != 0.0) r += pc.beta * Y[i];
  Y[i] = r;
}
#include "gemm_tile.glsl"
