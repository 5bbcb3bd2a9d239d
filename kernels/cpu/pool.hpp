// pool.cpp: what the fused kernels run of max pooling (conv.cpp's epilogue, fusion.cpp's backward runs).
#pragma once
#include <cstdint>

#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

// max_pool_forward's planes [pb, pe) of the (n, c) planes, on the calling thread.
void max_pool_planes(const PoolAttrs& a, const float* x, float* y, int64_t pb, int64_t pe);
// relu_grad: also the ReLU backward that follows when x is a ReLU's output, dx = x > 0 ? dx : 0.
// plane_sums (n * c floats, or null): also bias_plane_sum of each plane of dx, written as it is finished, for a
// BiasGrad of dx fused after it (bias_grad_from_plane_sums).
void max_pool_backward(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx, ThreadPool& pool,
                       bool relu_grad = false, float* plane_sums = nullptr);
// max_pool_backward's planes [pb, pe) of the (n, c) planes, on the calling thread.
void max_pool_backward_planes(const PoolAttrs& a, const float* x, const float* y, const float* dy, float* dx,
                              bool relu_grad, float* plane_sums, int64_t pb, int64_t pe);

// bf16 storage (x, y, dy, dx: uint16_t holding bf16): max_pool_backward with its options, float32 math (the
// plane sums are of dx as stored), `ws` max_pool_bf16_workspace_bytes of scratch (none, ws may be null, for 2x2 stride
// 2): the max_pool_backward kernel's workspace on bf16 storage, so a fused run can pass that call's workspace.
// max_pool_planes on bf16 planes (any geometry; a maximum of bf16 values is exact).
void max_pool_planes_bf16(const PoolAttrs& a, const uint16_t* x, uint16_t* y, int64_t pb, int64_t pe);
size_t max_pool_bf16_workspace_bytes(const PoolAttrs& a, int threads);
// max_pool_backward_bf16's planes [pb, pe) on the calling thread, where it needs no workspace (2x2 stride 2).
void max_pool_backward_planes_bf16(const PoolAttrs& a, const uint16_t* x, const uint16_t* y, const uint16_t* dy,
                                   uint16_t* dx, bool relu_grad, float* plane_sums, int64_t pb, int64_t pe);
void max_pool_backward_bf16(const PoolAttrs& a, const uint16_t* x, const uint16_t* y, const uint16_t* dy, uint16_t* dx,
                            float* ws, ThreadPool& pool, bool relu_grad = false, float* plane_sums = nullptr);

}  // namespace kiln::cpu
