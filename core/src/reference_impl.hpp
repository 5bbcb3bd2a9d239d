// Internal to the reference implementation: the per-family oracles reference_op dispatches to.
#pragma once
#include "kiln/ops.hpp"

namespace kiln::ref {

using In = const float* const*;
using Out = float* const*;

// reference.cpp: dense algebra, elementwise, reductions, dropout, optimizers.
void gemm(const GemmAttrs& a, In in, Out out);
void bias_add(const BiasAttrs& a, In in, Out out);
void bias_grad(const BiasAttrs& a, In in, Out out);
void elementwise(OpKind k, const ElementwiseAttrs& a, In in, Out out);
void reduce_sum(const ReduceAttrs& a, In in, Out out);
void concat_split(bool concat, const ConcatAttrs& a, In in, Out out);
void dropout(const DropoutAttrs& a, In in, Out out);
void sgd(const SgdAttrs& a, In in, Out out);
void adam(const AdamAttrs& a, In in, Out out);
void rmsprop(const RmspropAttrs& a, In in, Out out);
void ema(const EmaAttrs& a, In in, Out out);
void embedding(OpKind k, const EmbeddingAttrs& a, In in, Out out);
void layer_norm(OpKind k, const LayerNormAttrs& a, In in, Out out);
// reference_clip.cpp: gradient clipping by global norm.
void sum_squares(const ElementwiseAttrs& a, In in, Out out);
void clip_by_global_norm(const ElementwiseAttrs& a, In in, Out out);

// reference_attention.cpp: the ops attention is built from.
void batched_gemm(const GemmAttrs& a, In in, Out out);
void permute(const PermuteAttrs& a, In in, Out out);
// reference_batch_norm.cpp
void batch_norm(OpKind k, const BatchNormAttrs& a, In in, Out out);

// reference_nn.cpp: images, activations, softmax and losses.
void conv2d(OpKind k, const ConvAttrs& a, In in, Out out);
void pool(OpKind k, const PoolAttrs& a, In in, Out out);
void activation(OpKind k, const ActivationAttrs& a, In in, Out out);
void softmax(OpKind k, const SoftmaxAttrs& a, In in, Out out);
void loss(OpKind k, const LossAttrs& a, In in, Out out);

}  // namespace kiln::ref
