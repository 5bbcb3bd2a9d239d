// The GEMM body for llvmpipe (lavapipe), the CPU implementation of Vulkan: C(M, N) = op(A) * op(B), chosen by the
// host only on that driver (backends/vulkan/gemm.cpp). The generic tile (gemm_tile.glsl) stays the GPU kernel.
//
// Why a second kernel: llvmpipe runs a workgroup as SIMD-8 batches of invocations (one subgroup each, 256-bit AVX2).
// Every storage- or shared-memory load whose address differs between lanes becomes a loop over the 8 lanes with a
// branch and a scalar load per lane and component; every barrier() switches between the batches (coroutines). The
// shared-memory tile spends most of its time in those per-lane loads (16 from shared memory per 64 FMAs). Here no
// shared memory and no barrier is used; lanes share A through subgroupBroadcast (an extract and a splat on
// llvmpipe), and every load is a vec4 (the per-lane loop is paid once for four components):
//  - a subgroup (8 lanes) computes 32 rows x 32 columns; lane l owns columns 4l..4l+3 of them, all 32 rows
//    (32x4 accumulators), and loads four vec4 of A and four vec4 of B per 4 steps of K: 8 vec4 loads per 512
//    FMAs;
//  - a workgroup of 64 invocations = 8 subgroups covers 64 rows x 128 columns (2 x 4 subgroups);
//  - vec4 loads need 16-byte aligned rows: the host picks this kernel only when the contiguous dimension of each
//    operand is a multiple of 4 and both views start 16-byte aligned (else the generic tile runs);
//  - indices past M or N are clamped (loads stay inside the matrix) and never stored; steps of K past the range
//    (possible only when neither operand is contiguous along K) load a clamped index and are zeroed.
// Loop budget: one counted iteration per 4 steps of K (the K loop is the only loop; the rest is unrolled): the host
// keeps a dispatch's K range within kLvpMaxK (vulkan_ops.hpp).
//
// The including kernel defines LVP_TRANS_A / LVP_TRANS_B (0 or 1), binds A at 0, B at 1, Y at 2, declares the vec4
// aliases A4 / B4 of bindings 0 and 1, and defines before the include:
//   uint lvp_m(), lvp_n(), lvp_k(), lvp_kbegin(), lvp_kend()
//   uint lvp_a_base(), lvp_b_base()       element offsets of this workgroup's A and B (multiples of 4)
//   void lvp_store(uint m, uint n, float acc)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
layout(local_size_x = 64) in;

#define LVP_R 32           // rows per subgroup (16 measured slower: bench/results/vulkan_lavapipe.md)
#define LVP_P (LVP_R / 8)  // A rows per lane (A not transposed)

void main() {
  const uint lane = gl_LocalInvocationID.x & 7u, sg = gl_LocalInvocationID.x >> 3u;
  const uint M = lvp_m(), N = lvp_n(), K = lvp_k();
  // 8 subgroups: 2 along M, 4 along N: a 64x128 workgroup tile (gemm.cpp kLvpTileM, kLvpTileN).
  const uint row0 = gl_WorkGroupID.y * (2u * LVP_R) + (sg >> 2u) * LVP_R;
  const uint col0 = gl_WorkGroupID.x * 128u + (sg & 3u) * 32u;
  const uint kb = lvp_kbegin(), ke = min(lvp_kend(), K);
  const uint abase = lvp_a_base(), bbase = lvp_b_base();

  // This lane's load addresses (in elements), clamped into the matrix.
#if LVP_TRANS_A == 0
  // A (M, K): rows row0 + 8p + lane; a vec4 along K each.
  uint aoff[LVP_P];
  KILN_UNROLL for (uint p = 0u; p < LVP_P; ++p) aoff[p] = abase + min(row0 + 8u * p + lane, M - 1u) * K;
#else
  // A (K, M): rows row0 + 4*lane .. +3 (a vec4 along M) at each K step.
  const uint acol = min(row0 + 4u * lane, M - 4u);
#endif
#if LVP_TRANS_B == 0
  // B (K, N): columns col0 + 4*lane .. +3 (a vec4 along N) at each K step.
  const uint bcol = min(col0 + 4u * lane, N - 4u);
#else
  // B (N, K): columns col0 + 4*lane + c, c = 0..3; a vec4 along K each.
  uint boff[4];
  KILN_UNROLL for (uint c = 0u; c < 4u; ++c) boff[c] = bbase + min(col0 + 4u * lane + c, N - 1u) * K;
#endif

  float acc[LVP_R][4];
  KILN_UNROLL for (uint i = 0u; i < LVP_R; ++i)
    KILN_UNROLL for (uint j = 0u; j < 4u; ++j) acc[i][j] = 0.0;

#define LVP_FMA(i, av, kk) KILN_UNROLL for (uint j = 0u; j < 4u; ++j) acc[i][j] = fma(av, b[kk][j], acc[i][j]);
  for (uint k = kb; k < ke; k += 4u) {
    // B values: b[kk][c] = B(k + kk, col c of this lane).
    vec4 b[4];
#if LVP_TRANS_B == 0
    KILN_UNROLL for (uint kk = 0u; kk < 4u; ++kk) {
      const uint kr = min(k + kk, ke - 1u);
      b[kk] = B4[(bbase + kr * N + bcol) >> 2u];
      if (k + kk >= ke) b[kk] = vec4(0.0);
    }
#else
    {
      vec4 t[4];
      KILN_UNROLL for (uint c = 0u; c < 4u; ++c) t[c] = B4[(boff[c] + k) >> 2u];
      KILN_UNROLL for (uint kk = 0u; kk < 4u; ++kk) b[kk] = vec4(t[0][kk], t[1][kk], t[2][kk], t[3][kk]);
    }
#endif

#if LVP_TRANS_A == 0
    // a[p]: this lane's row row0 + 8p + lane at k .. k+3; row 8p + l's value comes from lane l.
    vec4 a[LVP_P];
    KILN_UNROLL for (uint p = 0u; p < LVP_P; ++p) a[p] = A4[(aoff[p] + k) >> 2u];
#define LVP_ROW(i, src, l, kk) { const float av = subgroupBroadcast(src[kk], l); LVP_FMA(i, av, kk) }
    KILN_UNROLL for (uint p = 0u; p < LVP_P; ++p)
      KILN_UNROLL for (uint kk = 0u; kk < 4u; ++kk) {
        LVP_ROW(8u * p + 0u, a[p], 0u, kk) LVP_ROW(8u * p + 1u, a[p], 1u, kk) LVP_ROW(8u * p + 2u, a[p], 2u, kk)
        LVP_ROW(8u * p + 3u, a[p], 3u, kk) LVP_ROW(8u * p + 4u, a[p], 4u, kk) LVP_ROW(8u * p + 5u, a[p], 5u, kk)
        LVP_ROW(8u * p + 6u, a[p], 6u, kk) LVP_ROW(8u * p + 7u, a[p], 7u, kk)
      }
#else
#define LVP_ROWT(i, src, c, l, kk) { const float av = subgroupBroadcast(src[c], l); LVP_FMA(i, av, kk) }
#define LVP_GROUP(g, src, l, kk)                                                                  \
  LVP_ROWT(4u * g + 0u, src, 0u, l, kk) LVP_ROWT(4u * g + 1u, src, 1u, l, kk)                  \
  LVP_ROWT(4u * g + 2u, src, 2u, l, kk) LVP_ROWT(4u * g + 3u, src, 3u, l, kk)
    // q[kk]: rows row0 + 4*lane .. +3 at step k + kk; row 4g + c comes from lane g, component c.
    vec4 q[4];
    KILN_UNROLL for (uint kk = 0u; kk < 4u; ++kk) {
      q[kk] = A4[(abase + min(k + kk, ke - 1u) * M + acol) >> 2u];
      if (k + kk >= ke) q[kk] = vec4(0.0);
    }
    KILN_UNROLL for (uint kk = 0u; kk < 4u; ++kk) {
      LVP_GROUP(0u, q[kk], 0u, kk) LVP_GROUP(1u, q[kk], 1u, kk) LVP_GROUP(2u, q[kk], 2u, kk)
      LVP_GROUP(3u, q[kk], 3u, kk) LVP_GROUP(4u, q[kk], 4u, kk) LVP_GROUP(5u, q[kk], 5u, kk)
      LVP_GROUP(6u, q[kk], 6u, kk) LVP_GROUP(7u, q[kk], 7u, kk)
    }
#endif
  }

  KILN_UNROLL for (uint i = 0u; i < LVP_R; ++i) {
    const uint m = row0 + i;
    KILN_UNROLL for (uint j = 0u; j < 4u; ++j) {
      const uint n = col0 + 4u * lane + j;
      if (m < M && n < N) lvp_store(m, n, acc[i][j]);
    }
  }
}
