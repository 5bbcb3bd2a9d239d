// Host entry points of the CUDA kernels (kernels/cuda/*.cu). Each enqueues its kernel(s) on `s` and throws
// kiln::DeviceError naming the kernel when the launch fails. Semantics: core/include/kiln/ops.hpp. This header
// includes no Kiln header so the .cu files compile without the C++20 SDK headers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kiln::cuda::kernels {

// Scalars of the ops whose attributes change every step (learning rate, Adam's t, dropout counter). A kernel
// reads them from `dev` when it is not null (a slot of the device scalar buffer that a replayed CUDA graph
// points at, rewritten before each replay) and from the by-value copy otherwise.
struct SgdParams {
  float lr, momentum, weight_decay;
  int nesterov;
};
struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  double bias1, bias2;  // 1 - beta1^t, 1 - beta2^t
  float decoupled_decay;  // AdamW: w *= 1 - lr * decoupled_decay first
};
struct RmspropParams {
  float lr, rho, eps, momentum;
};
struct EmaParams {
  float decay;
};
struct DropoutParams {
  float rate;
  uint32_t seed, counter;
};
inline constexpr size_t kParamSlotBytes = 64;  // every *Params fits one slot
static_assert(sizeof(AdamParams) <= kParamSlotBytes && sizeof(SgdParams) <= kParamSlotBytes);

enum class Act : int { relu = 0, sigmoid = 1, tanh = 2, gelu = 3, gelu_tanh = 4, silu = 5 };

// ---- elementwise.cu
void bias_add(cudaStream_t s, const float* x, const float* b, float* y, int64_t outer, int64_t channels,
              int64_t inner);
void add(cudaStream_t s, const float* a, const float* b, float* y, int64_t n, float alpha, float beta);
void mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t n);
void axpby(cudaStream_t s, const float* x, float* y, int64_t n, float alpha, float beta);
void scale(cudaStream_t s, const float* x, float* y, int64_t n, float alpha);
void fill(cudaStream_t s, float* y, int64_t n, float value);
void activation_forward(cudaStream_t s, Act act, const float* x, float* y, int64_t n);
void activation_backward(cudaStream_t s, Act act, const float* y, const float* dy, float* dx, int64_t n);
// y_i = keep_i ? x_i / (1 - rate) : 0 with keep_i = dropout_uniform(seed, counter, i) >= rate (both passes).
void dropout(cudaStream_t s, const float* x, float* y, int64_t n, const DropoutParams& p, const DropoutParams* dev);
// out(p, y, x) = in(p, y + dy, x + dx), 0 where that falls outside `in` (explicit padding and cropping).
void shift_copy(cudaStream_t s, const float* in, float* out, int64_t planes, int64_t ih, int64_t iw, int64_t oh,
                int64_t ow, int64_t dy, int64_t dx);

// ---- embedding.cu: gather rows; the gradient sums rows per table element in order (deterministic)
void embedding_forward(cudaStream_t s, const float* ids, const float* table, float* y, int64_t rows, int64_t vocab,
                       int64_t dim);
void embedding_backward(cudaStream_t s, const float* ids, const float* dy, float* dtable, int64_t rows, int64_t vocab,
                        int64_t dim);

// ---- reduce.cu
void bias_grad(cudaStream_t s, const float* dy, float* db, int64_t outer, int64_t channels, int64_t inner);
void reduce_sum(cudaStream_t s, const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner);
// causal: row r keeps columns j <= r % cols, the others get 0 (attention's mask).
void softmax_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols, bool causal = false);
// ---- layer_norm.cu (beta / dbeta null without bias)
void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* rstd, int64_t rows, int64_t cols, float eps);
void layer_norm_backward(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dgamma, float* dbeta, int64_t rows, int64_t cols);
void softmax_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);

// ---- attention.cu: y = x with permuted axes; y's axis i has ydims[i] entries, x stride steps[i] (rank <= 6).
struct PermuteShape {
  int rank;
  int64_t ydims[6], steps[6];
};
void permute(cudaStream_t s, const float* x, float* y, const PermuteShape& p, int64_t n);
// ---- batch_norm.cu (x viewed as (n, c, inner); training updates the running statistics in place)
void batch_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* rstd, float* running_mean, float* running_var, int64_t n, int64_t c, int64_t inner,
                        float eps, float momentum, bool training);
void batch_norm_backward(cudaStream_t s, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, float* dgamma, float* dbeta, int64_t n, int64_t c, int64_t inner,
                         bool training);

// ---- loss.cu: fused loss value + gradient. The value is summed deterministically (fixed order, in double)
// through `workspace`, which must hold loss_workspace_bytes(kind, rows, cols).
// softmax_cross_entropy_soft: labels are (rows, cols) class probabilities (LossAttrs::soft_labels).
enum class Loss { softmax_cross_entropy, mse, bce_logits, bce_probs, softmax_cross_entropy_soft };
size_t loss_workspace_bytes(Loss kind, int64_t rows, int64_t cols);
void loss(cudaStream_t s, Loss kind, const float* pred, const float* target, float* value, float* grad,
          int64_t rows, int64_t cols, float scale, void* workspace);

// ---- pool.cu
struct PoolShape {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
};
void max_pool_forward(cudaStream_t s, const PoolShape& p, const float* x, float* y);
void max_pool_backward(cudaStream_t s, const PoolShape& p, const float* x, const float* y, const float* dy,
                       float* dx);
void avg_pool_forward(cudaStream_t s, const PoolShape& p, const float* x, float* y);
void avg_pool_backward(cudaStream_t s, const PoolShape& p, const float* dy, float* dx);

// ---- optimizer.cu: one fused kernel per update, computed in double like the reference.
void sgd(cudaStream_t s, const float* g, float* w, float* v, int64_t n, const SgdParams& p, const SgdParams* dev);
void adam(cudaStream_t s, const float* g, float* w, float* m, float* v, int64_t n, const AdamParams& p,
          const AdamParams* dev);
void rmsprop(cudaStream_t s, const float* g, float* w, float* sq, float* buf, int64_t n, const RmspropParams& p,
             const RmspropParams* dev);
void ema(cudaStream_t s, const float* w, float* shadow, int64_t n, const EmaParams& p, const EmaParams* dev);

// clip.cu: gradient clipping by global norm. y = alpha * sum x^2 + beta * y; x *= min(1, max_norm / (sqrt(s) + 1e-6)).
void sum_squares(cudaStream_t s, const float* x, float* y, int64_t n, float alpha, float beta);
void clip_by_global_norm(cudaStream_t s, const float* sumsq, float* x, int64_t n, float max_norm);

}  // namespace kiln::cuda::kernels
