// GEMM and batched GEMM through cuBLAS (cublasGemmEx, cublasGemmStridedBatchedEx): row-major Kiln matrices as the
// transposed column-major product, on the device's cuBLAS handle (bound to its op stream), with the call's
// workspace as cuBLAS's workspace. FP32, or TF32 tensor cores with KILN_CUDA_TF32=1.
// 16-bit storage: A and B both bfloat16 (or both float16) with y of that type or float32 run natively on the
// tensor cores, accumulating in float32 (CUBLAS_COMPUTE_32F) and rounding y once; other mixes of types go through
// the device's float32 conversion (dispatch.cpp).
#include <cublas_v2.h>

#include <climits>
#include <string>

#include "common.cuh"
#include "cuda_device.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda::kernels {
namespace {

const void* in_ptr(const OpCall& c, size_t i) { return c.in[i].raw(); }
void* out_ptr(const OpCall& c, size_t i) { return c.out[i].raw(); }

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The pairs cublasGemmEx takes with CUBLAS_COMPUTE_32F: A and B of one 16-bit type, y of it or float32. With
// k == 0 the product only scales y, which the float32 path does.
bool gemm_takes_types(const OpCall& c) {
  const DType t = c.in[0].dtype;
  if (t == DType::f32 || c.in[1].dtype != t) return false;
  if (c.out[0].dtype != t && c.out[0].dtype != DType::f32) return false;
  return std::get<GemmAttrs>(c.attrs).k > 0;
}

// TF32 applies to float32 operands only; 16-bit ones run on the tensor cores with float32 accumulation.
cublasComputeType_t compute_type(const OpCall& c, bool tf32) {
  return tf32 && c.in[0].dtype == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

Support gemm_supports(const GemmAttrs& a) {
  for (int64_t v : {a.m, a.n, a.k, a.batch})
    if (v < 0 || v > INT_MAX)
      return {false, "cuBLAS takes GEMM sizes in [0, 2^31): found m=" + std::to_string(a.m) + " n=" +
                         std::to_string(a.n) + " k=" + std::to_string(a.k) + " batch=" + std::to_string(a.batch)};
  return {};
}

// The workspace cuBLAS is given (its recommended size: 32 MiB on Hopper, 4 MiB before), within `limit`.
size_t gemm_workspace_bytes(const GemmAttrs& a, int cc_major, size_t limit) {
  if (a.m == 0 || a.n == 0 || a.k == 0) return 0;
  const size_t recommended = cc_major >= 9 ? size_t{32} << 20 : size_t{4} << 20;
  return recommended < limit ? recommended : limit;
}

// y = alpha op(A) op(B) + beta y on the handle's stream.
void gemm_run(cublasHandle_t handle, cudaStream_t stream, const GemmAttrs& a, const OpCall& call, bool tf32) {
  if (a.m == 0 || a.n == 0) return;
  void* y = out_ptr(call, 0);
  if (a.k == 0) {  // op(A) op(B) is all zeros: y = beta y, and y is not read when beta == 0 (float32 here)
    float* yf = static_cast<float*>(y);
    if (a.beta == 0.f)
      fill(stream, yf, a.m * a.n, 0.f);
    else
      scale(stream, yf, yf, a.m * a.n, a.beta);
    return;
  }
  // cuBLAS workspace per call: the executor's buffer, 256-aligned by the core allocator. A zero size means
  // "no workspace" to cuBLAS (algorithms that need one are skipped).
  const bool have_ws = call.workspace.block && call.workspace.bytes > 0;
  void* ws = have_ws ? static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset : nullptr;
  KILN_CUBLAS_CHECK(cublasSetWorkspace(handle, ws, have_ws ? call.workspace.bytes : 0));
  // Row-major y(m,n) = op(A) op(B) is column-major y^T(n,m) = op(B)^T op(A)^T: swap the operands.
  const int m = static_cast<int>(a.m), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  const cublasOperation_t op_b = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = a.trans_b ? k : n;  // B stored (n,k) or (k,n), row-major
  const int lda = a.trans_a ? m : k;  // A stored (k,m) or (m,k)
  const float alpha = a.alpha, beta = a.beta;
  KILN_CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, n, m, k, &alpha, in_ptr(call, 1), cuda_type(call.in[1].dtype), ldb,
                                 in_ptr(call, 0), cuda_type(call.in[0].dtype), lda, &beta, y,
                                 cuda_type(call.out[0].dtype), n, compute_type(call, tf32), CUBLAS_GEMM_DEFAULT));
}

// a.batch products of matrices stored one after another.
void batched_gemm_run(cublasHandle_t handle, cudaStream_t stream, const GemmAttrs& a, const OpCall& call, bool tf32) {
  if (a.m == 0 || a.n == 0 || a.batch == 0) return;
  void* y = out_ptr(call, 0);
  if (a.k == 0) {  // float32 here (gemm_takes_types)
    float* yf = static_cast<float*>(y);
    if (a.beta == 0.f)
      fill(stream, yf, a.batch * a.m * a.n, 0.f);
    else
      scale(stream, yf, yf, a.batch * a.m * a.n, a.beta);
    return;
  }
  const bool have_ws = call.workspace.block && call.workspace.bytes > 0;
  void* ws = have_ws ? static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset : nullptr;
  KILN_CUBLAS_CHECK(cublasSetWorkspace(handle, ws, have_ws ? call.workspace.bytes : 0));
  // As gemm_run: row-major y_b = op(A_b) op(B_b) is column-major y_b^T = op(B_b)^T op(A_b)^T.
  const int m = static_cast<int>(a.m), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  const int ldb = a.trans_b ? k : n, lda = a.trans_a ? m : k;
  const float alpha = a.alpha, beta = a.beta;
  KILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
      in_ptr(call, 1), cuda_type(call.in[1].dtype), ldb, static_cast<long long>(a.k * a.n), in_ptr(call, 0),
      cuda_type(call.in[0].dtype), lda, static_cast<long long>(a.m * a.k), &beta, y, cuda_type(call.out[0].dtype), n,
      static_cast<long long>(a.m * a.n), static_cast<int>(a.batch), compute_type(call, tf32), CUBLAS_GEMM_DEFAULT));
}

Support supports(OpKind, const OpAttrs& a) { return gemm_supports(std::get<GemmAttrs>(a)); }
size_t workspace(const CudaDevice& d, const OpCall& c) {
  return gemm_workspace_bytes(std::get<GemmAttrs>(c.attrs), d.cc_major(), d.workspace_limit());
}

}  // namespace

KILN_CUDA_KERNELS(gemm) {
  register_cuda_kernel(OpKind::Gemm, {.run =
                                          [](const CudaOp& op) {
                                            gemm_run(op.device.cublas(), op.stream, op.attrs<GemmAttrs>(), op.call,
                                                     op.device.tf32());
                                          },
                                      .support = supports,
                                      .workspace = workspace,
                                      .takes_types = gemm_takes_types});
  register_cuda_kernel(OpKind::BatchedGemm, {.run =
                                                 [](const CudaOp& op) {
                                                   batched_gemm_run(op.device.cublas(), op.stream,
                                                                    op.attrs<GemmAttrs>(), op.call, op.device.tf32());
                                                 },
                                             .support = supports,
                                             .workspace = workspace,
                                             .takes_types = gemm_takes_types});
}

}  // namespace kiln::cuda::kernels
