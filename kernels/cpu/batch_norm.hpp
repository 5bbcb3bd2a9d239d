// batch_norm.cpp: what the fused batch-norm runs call (fusion.cpp): a ReLU after the forward pass, a ReLU's backward
// in front of the backward pass.
#pragma once
#include <cstdint>

#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

// relu_out (fused ActivationForward relu, fusion.cpp): also writes relu_out = ReLU(y) (may be y).
void batch_norm_forward(const BatchNormAttrs& a, const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, float* running_mean, float* running_var, ThreadPool& pool,
                        float* relu_out = nullptr);
// A ReLU's backward fused in front of batch_norm_backward (fusion.cpp): dy = relu_y > 0 ? dz : 0 (ActivationBackward
// relu) is computed in the statistics sweep and written to dy, then used as batch_norm_backward uses it. Long runs
// only (batch_norm_long_runs); dy may alias dz or relu_y, dx may alias dy.
template <class T>
struct ReluInFrontT {
  const T* relu_y = nullptr;
  const T* dz = nullptr;
};
using ReluInFront = ReluInFrontT<float>;
bool batch_norm_long_runs(const BatchNormAttrs& a);
void batch_norm_backward_relu(const BatchNormAttrs& a, const float* x, const float* gamma, const float* mean,
                              const float* rstd, const ReluInFront& r, float* dy, float* dx, float* dgamma,
                              float* dbeta, ThreadPool& pool);

// The same on bf16 activations (x, y, relu_out / x, dy, dz, relu_y, dx: uint16_t holding bf16), float32 math,
// parameters and statistics float32: what a bf16 layer's calls would fuse into. batch_norm_forward_bf16 without
// relu_out is the batch_norm_forward kernel on bf16 storage.
void batch_norm_forward_bf16(const BatchNormAttrs& a, const uint16_t* x, const float* gamma, const float* beta,
                             uint16_t* y, float* mean, float* rstd, float* running_mean, float* running_var,
                             ThreadPool& pool, uint16_t* relu_out = nullptr);
void batch_norm_backward_relu_bf16(const BatchNormAttrs& a, const uint16_t* x, const float* gamma, const float* mean,
                                   const float* rstd, const ReluInFrontT<uint16_t>& r, uint16_t* dy, uint16_t* dx,
                                   float* dgamma, float* dbeta, ThreadPool& pool);

}  // namespace kiln::cpu
