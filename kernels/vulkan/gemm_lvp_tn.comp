#version 450
// gemm for llvmpipe, op(A) = A^T and op(B) = B: y(M, N) = alpha * op(A) * op(B) + beta * y (gemm_lvp.glsl); the
// host picks it on llvmpipe when the operands allow vec4 loads, for gemm (batch = 1) and batched_gemm.
#define LVP_TRANS_A 1
#define LVP_TRANS_B 0
#include "gemm_lvp_common.glsl"
