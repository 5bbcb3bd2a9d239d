// The CPU backend's kernels: plain functions over host pointers. Each runs on the device's ThreadPool
// (OpenMP is used for `omp simd` only) and never allocates; scratch comes from the caller's workspace.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

// Below this many elements a kernel runs on the calling thread alone: waking a worker costs more.
inline constexpr int64_t kParallelMin = 32768;

// How many chunks to cut `work` elements into: a few per thread, so a thread that starts late or loses its
// core hands its share to the others; 1 (no pool traffic at all) for small work or a single thread.
inline int64_t parts_for(int64_t work, const ThreadPool& pool) {
  return pool.size() > 1 && work >= kParallelMin ? 4 * static_cast<int64_t>(pool.size()) : 1;
}

// gemm.cpp. OpenBLAS runs single-threaded inside our pool's threads (see gemm.cpp for why).
void blas_init();
// Four 256x512x200 sgemm calls per pool thread, spread over the pool, when a device opens. Measured, not explained: on
// Kiln's development VM (Zen 4 under Firecracker, Debian's OpenBLAS 0.3.21 on 4 KiB pages), a process whose first sgemm
// calls had narrow outputs stays in a state where OpenBLAS's kernel runs at a third of its speed (12 against 37
// GFLOP/s single-threaded at 256x256x784) for the rest of its life, and wider calls first avoid it (most of the time:
// 23 of 24 runs; one call per thread, 5 of 6); with transparent huge pages "always" neither happens
// (bench/results/cpu_ops.md). KILN_OPENBLAS_WARMUP=0 skips it.
void blas_warm_up(ThreadPool& pool);
void gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool);
// Row-major sgemm on the calling thread only, with leading dimensions (used by the conv kernels).
void sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// conv.cpp. Workspace in floats; the kernels check the size they were given. `winograd`: 3x3 stride-1
// convolutions may run through oneDNN's Winograd kernels (conv_dnnl.cpp; [device] winograd); the workspace and the
// kernels of one op must be asked with the same value.
size_t conv_workspace_floats(OpKind k, const ConvAttrs& a, int threads, bool winograd);
// What a fused conv2d_forward also does: y += bias[k] per filter (BiasAdd), then relu_out = ReLU(y)
// (ActivationForward relu; relu_out may be y, or null for no ReLU), then pool_out = MaxPoolForward(relu_out)
// with `pool` (null: no pooling; only after a ReLU). A null epilogue: none of these.
struct ConvEpilogue {
  const float* bias = nullptr;
  float* relu_out = nullptr;
  const PoolAttrs* pool = nullptr;
  float* pool_out = nullptr;
};
// The epilogue after a convolution wrote images [n0, n1) of y: the bias (with add_bias; the im2col path prefills it,
// oneDNN may add it), then relu_out = ReLU(y) and the max pool, as ConvEpilogue says. Same arithmetic as the
// unfused BiasAdd, ActivationForward (NaN passes through) and MaxPoolForward.
void conv_epilogue(const ConvAttrs& a, const ConvEpilogue& ep, bool add_bias, float* y, int64_t n0, int64_t n1);
// What a fused backward convolution runs first: it writes dy's images [n0, n1) (a max-pool backward, with the
// ReLU's gradient and the bias's plane sums, writes them: fusion.cpp). Called with ranges that cover the batch once,
// each range on one thread, before anything reads those images; ranges may run on several threads at once.
struct ConvPrologue {
  void (*fn)(const void* ctx, int64_t n0, int64_t n1) = nullptr;
  const void* ctx = nullptr;
  void operator()(int64_t n0, int64_t n1) const { fn(ctx, n0, n1); }
};
// conv_dnnl.cpp: the convolution through oneDNN where the plugin was built with it and oneDNN takes this geometry
// (false: the caller runs its im2col path). Workspace in floats, for `threads` threads.
bool dnnl_conv_workspace(OpKind kind, const ConvAttrs& a, int threads, bool winograd, size_t& floats);
// With `ep` (Conv2dForward only), the epilogue too, each slice's images while they are in cache. With `pro`
// (backward data and filter), the prologue produces each slice's dy images right before the slice reads them.
bool dnnl_conv(OpKind kind, const ConvAttrs& a, const float* in0, const float* in1, float* out, float* ws,
               ThreadPool& pool, bool winograd, const ConvEpilogue* ep = nullptr, const ConvPrologue* pro = nullptr);
// Backward data and backward filter of one convolution in one pass over the slices, each slice's dy reordered once for
// both (with `pro`, produced first), in backward filter's workspace (conv_workspace_floats sizes it to hold the pair).
// dx and dw are bit for bit the two ops'. False (nothing run) where oneDNN does not take both or `ws_floats` is smaller.
bool dnnl_conv_backward_pair(const ConvAttrs& a, const float* dy, const float* w, const float* x, float* dx, float* dw,
                             float* ws, size_t ws_floats, ThreadPool& pool, bool winograd, const ConvPrologue* pro);
void conv2d_forward(const ConvAttrs& a, const float* x, const float* w, float* y, float* ws, ThreadPool& pool,
                    bool winograd, const ConvEpilogue* ep = nullptr);
// With `pro`, dy is first written by the prologue: slice by slice inside oneDNN's path, or all of it (over the pool's
// threads) before the im2col path.
void conv2d_backward_data(const ConvAttrs& a, const float* dy, const float* w, float* dx, float* ws, ThreadPool& pool,
                          bool winograd, const ConvPrologue* pro = nullptr);
void conv2d_backward_filter(const ConvAttrs& a, const float* x, const float* dy, float* dw, float* ws, ThreadPool& pool,
                            bool winograd, const ConvPrologue* pro = nullptr);

// pool.cpp
void max_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool);
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
void avg_pool_forward(const PoolAttrs& a, const float* x, float* y, ThreadPool& pool);
void avg_pool_backward(const PoolAttrs& a, const float* dy, float* dx, ThreadPool& pool);

// activation.cpp: activations, softmax.
void activation_forward(const ActivationAttrs& a, const float* x, float* y, ThreadPool& pool);
void activation_backward(const ActivationAttrs& a, const float* y, const float* dy, float* dx, ThreadPool& pool);
void softmax_forward(const SoftmaxAttrs& a, const float* x, float* y, ThreadPool& pool);
void softmax_backward(const SoftmaxAttrs& a, const float* y, const float* dy, float* dx, ThreadPool& pool);

// loss.cpp: fused forward + backward losses. `partials` holds at least loss_partials(pool.size()) doubles.
inline constexpr size_t loss_partials(int threads) { return static_cast<size_t>(4 * threads) * 8; }
void softmax_cross_entropy(const LossAttrs& a, const float* x, const float* labels, float* loss, float* dx,
                           double* partials, ThreadPool& pool);
void mean_squared_error(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                        ThreadPool& pool);
void binary_cross_entropy(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                          ThreadPool& pool);

// elementwise.cpp: bias, elementwise, reductions, concat/split, dropout.
void bias_add(const BiasAttrs& a, const float* x, const float* b, float* y, ThreadPool& pool);
void bias_grad(const BiasAttrs& a, const float* dy, float* db, ThreadPool& pool);
// bias_grad with inner > 1 sums each (outer, channel) plane with bias_plane_sum (one function, so a fused kernel
// that calls it gets the same bits), then the planes of a channel in outer order in double.
float bias_plane_sum(const float* p, int64_t count);
// The same db from the planes' sums (sums[o * channels + c]), computed elsewhere with bias_plane_sum.
void bias_grad_from_plane_sums(const BiasAttrs& a, const float* sums, float* db);
void add(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool);
void mul(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool);
void axpby(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool);
void scale(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool);
void fill(const ElementwiseAttrs& a, float* y, ThreadPool& pool);
void copy(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool);
void reduce_sum(const ReduceAttrs& a, const float* x, float* y, ThreadPool& pool);
void concat(const ConcatAttrs& a, const float* const* xs, float* y, ThreadPool& pool);
void split(const ConcatAttrs& a, const float* y, float* const* xs, ThreadPool& pool);
void dropout(const DropoutAttrs& a, const float* x, float* y, ThreadPool& pool);

// optimizer.cpp: one fused loop per update.
void sgd_update(const SgdAttrs& a, const float* g, float* w, float* v, ThreadPool& pool);
void adam_update(const AdamAttrs& a, const float* g, float* w, float* m, float* v, ThreadPool& pool);
void rmsprop_update(const RmspropAttrs& a, const float* g, float* w, float* sq, float* buf, ThreadPool& pool);
void ema_update(const EmaAttrs& a, const float* w, float* shadow, ThreadPool& pool);

// clip.cpp: gradient clipping by global norm (partials: the device's per-thread sums, as the losses use).
void sum_squares(const ElementwiseAttrs& a, const float* x, float* y, double* partials, ThreadPool& pool);
void clip_by_global_norm(const ElementwiseAttrs& a, const float* s, float* x, ThreadPool& pool);

// embedding.cpp
void embedding_forward(const EmbeddingAttrs& a, const float* ids, const float* table, float* y, ThreadPool& pool);
void embedding_backward(const EmbeddingAttrs& a, const float* ids, const float* dy, float* dtable, ThreadPool& pool);

// attention.cpp: batched GEMM (GemmAttrs::batch matrices one after another) and axis permutation.
void batched_gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool);
void permute(const PermuteAttrs& a, const float* x, float* y, ThreadPool& pool);

// layer_norm.cpp (beta / dbeta null without bias)
void layer_norm_forward(const LayerNormAttrs& a, const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, ThreadPool& pool);
void layer_norm_backward(const LayerNormAttrs& a, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, ThreadPool& pool);

// batch_norm.cpp
// relu_out (fused ActivationForward relu, fusion.cpp): also writes relu_out = ReLU(y) (may be y).
void batch_norm_forward(const BatchNormAttrs& a, const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, float* running_mean, float* running_var, ThreadPool& pool,
                        float* relu_out = nullptr);
void batch_norm_backward(const BatchNormAttrs& a, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, ThreadPool& pool);
// A ReLU's backward fused in front of batch_norm_backward (fusion.cpp): dy = relu_y > 0 ? dz : 0 (ActivationBackward
// relu) is computed in the statistics sweep and written to dy, then used as batch_norm_backward uses it. Long runs
// only (batch_norm_long_runs); dy may alias dz or relu_y, dx may alias dy.
struct ReluInFront {
  const float* relu_y = nullptr;
  const float* dz = nullptr;
};
bool batch_norm_long_runs(const BatchNormAttrs& a);
void batch_norm_backward_relu(const BatchNormAttrs& a, const float* x, const float* gamma, const float* mean,
                              const float* rstd, const ReluInFront& r, float* dy, float* dx, float* dgamma,
                              float* dbeta, ThreadPool& pool);

}  // namespace kiln::cpu
