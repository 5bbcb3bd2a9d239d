// The op families of the Vulkan backend; each lives in the file of the same name (gemm.cpp, conv.cpp, ...).
#pragma once
#include <cstddef>
#include <cstdint>

#include "encoder.hpp"
#include "kiln/device.hpp"

namespace kiln::vulkan {

// Records `call` (already checked against op_arity and op_support).
void run_op(Encoder& e, const OpCall& call);
// Whether this backend runs the op with these attrs on a device with these limits, and why not.
Support op_support(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits);
// Scratch an op would like (the split-K partial sums of conv2d_backward_filter); ops run without it too.
size_t op_workspace_bytes(const OpCall& call);

void run_gemm(Encoder& e, const OpCall& c);
void run_bias(Encoder& e, const OpCall& c);
void run_conv(Encoder& e, const OpCall& c);
size_t conv_workspace_bytes(const ConvAttrs& a);
void run_pool(Encoder& e, const OpCall& c);
void run_activation(Encoder& e, const OpCall& c);
void run_softmax(Encoder& e, const OpCall& c);
void run_loss(Encoder& e, const OpCall& c);
void run_elementwise(Encoder& e, const OpCall& c);
void run_reduce(Encoder& e, const OpCall& c);
void run_concat(Encoder& e, const OpCall& c);
void run_dropout(Encoder& e, const OpCall& c);
void run_optimizer(Encoder& e, const OpCall& c);
void run_embedding(Encoder& e, const OpCall& c);

// The most iterations any one shader loop may run: llvmpipe (lavapipe) silently ends loops after 65535
// iterations, so long reductions are split over several dispatches and longer inner loops are refused.
inline constexpr int64_t kMaxLoop = 32768;

// Narrowing for push constants; op_support has already refused sizes that do not fit.
inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t ceil_div(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

}  // namespace kiln::vulkan
