// GEMM through cuBLAS (cublasGemmEx): row-major Kiln matrices as the transposed column-major product.
#pragma once
#include <cublas_v2.h>

#include "kiln/device.hpp"

namespace kiln::cuda {

Support gemm_supports(const GemmAttrs& a);
// The workspace cuBLAS is given for a GEMM (its recommended size: 32 MiB on Hopper, 4 MiB before), within `limit`.
size_t gemm_workspace_bytes(const GemmAttrs& a, int cc_major, size_t limit);
// Enqueues y = alpha op(A) op(B) + beta y on the handle's stream, with call.workspace as cuBLAS's workspace.
// tf32: CUBLAS_COMPUTE_32F_FAST_TF32 instead of exact FP32.
void gemm_run(cublasHandle_t handle, cudaStream_t stream, const GemmAttrs& a, const OpCall& call, bool tf32);
// BatchedGemm: a.batch products of matrices stored one after another (cublasGemmStridedBatchedEx).
void batched_gemm_run(cublasHandle_t handle, cudaStream_t stream, const GemmAttrs& a, const OpCall& call, bool tf32);

}  // namespace kiln::cuda
