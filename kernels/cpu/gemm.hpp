// gemm.cpp: GEMM on the device's thread pool, and what the other kernels that call BLAS share with it (attention.cpp's
// batched GEMM, conv.cpp's convolutions).
#pragma once
#include <cstdint>

#include "backend.hpp"
#include "kiln/device.hpp"
#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

// OpenBLAS runs single-threaded inside our pool's threads (see gemm.cpp for why).
void blas_init();
// Four 256x512x200 sgemm calls per pool thread, spread over the pool, when a device opens. Measured, not explained: on
// Kiln's development VM (Zen 4 under Firecracker, Debian's OpenBLAS 0.3.21 on 4 KiB pages), a process whose first sgemm
// calls had narrow outputs stays in a state where OpenBLAS's kernel runs at a third of its speed (12 against 37
// GFLOP/s single-threaded at 256x256x784) for the rest of its life, and wider calls first avoid it (most of the time:
// 23 of 24 runs; one call per thread, 5 of 6); with transparent huge pages "always" neither happens
// (bench/results/cpu_ops.md). KILN_OPENBLAS_WARMUP=0 skips it.
void blas_warm_up(ThreadPool& pool);
void gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool);
// Row-major sgemm on the calling thread only, with leading dimensions (used by the conv and batched GEMM kernels).
void sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The batched product on bf16 inputs (float32 or bf16 output) through oneDNN's matmul where the plugin has oneDNN:
// whether it runs the call, its workspace (per-thread scratchpads), and the run (attention.cpp registers them).
bool batched_gemm_bf16_takes(const OpCall& c);
size_t batched_gemm_bf16_workspace(const CpuDevice& d, const OpCall& c);
void batched_gemm_bf16(CpuDevice& d, const OpCall& c);

// Dimension checks of the kernels that call BLAS with 32-bit sizes: gemm and batched_gemm, convolutions.
Support gemm_supports(OpKind kind, const OpAttrs& attrs);
Support conv_supports(OpKind kind, const OpAttrs& attrs);

}  // namespace kiln::cpu
