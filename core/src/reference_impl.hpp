// Internal to the reference implementation: the per-family oracles reference_op dispatches to.
#pragma once
#include "kiln/ops.hpp"

namespace kiln::ref {

using In = const float* const*;
using Out = float* const*;

// reference_nn.cpp: images, activations, softmax and losses.
void conv2d(OpKind k, const ConvAttrs& a, In in, Out out);
void pool(OpKind k, const PoolAttrs& a, In in, Out out);
void activation(OpKind k, const ActivationAttrs& a, In in, Out out);
void softmax(OpKind k, const SoftmaxAttrs& a, In in, Out out);
void loss(OpKind k, const LossAttrs& a, In in, Out out);

}  // namespace kiln::ref
