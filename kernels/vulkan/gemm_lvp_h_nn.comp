#version 450
// gemm_lvp_nn.comp on float16 A and B (gemm_lvp_half_common.glsl): the host picks it on llvmpipe for a gemm or
// batched_gemm whose operands are both float16 and allow the vec4 loads.
#define LVP_TRANS_A 0
#define LVP_TRANS_B 0
#include "gemm_lvp_half_common.glsl"
