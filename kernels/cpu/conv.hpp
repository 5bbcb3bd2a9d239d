// conv.cpp: 2-D convolution (im2col + sgemm, or oneDNN's through conv_dnnl.cpp), with what a fused call
// (fusion.cpp) runs after it (ConvEpilogue) or before it (ConvPrologue). `winograd`: 3x3 stride-1 convolutions may
// run through oneDNN's Winograd kernels (conv_dnnl.cpp; [device] winograd); the workspace and the kernels of one op
// must be asked with the same value. Workspace in floats; the kernels check the size they were given.
#pragma once
#include <cstdint>

#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

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
// The same for a bf16 layer (y, relu_out, pool_out bf16; bias float32): the unfused bf16 ops' arithmetic (y + bias
// rounded to bf16 once, as BiasAdd on bf16 storage; the ReLU and the max pool are exact on bf16 values).
struct ConvEpilogueBf16 {
  const float* bias = nullptr;
  uint16_t* relu_out = nullptr;
  const PoolAttrs* pool = nullptr;
  uint16_t* pool_out = nullptr;
};
void conv_epilogue_bf16(const ConvAttrs& a, const ConvEpilogueBf16& ep, uint16_t* y, int64_t n0, int64_t n1);
// What a fused backward convolution runs first: it writes dy's images [n0, n1) (a max-pool backward, with the
// ReLU's gradient and the bias's plane sums, writes them: fusion.cpp). Called with ranges that cover the batch once,
// each range on one thread, before anything reads those images; ranges may run on several threads at once.
struct ConvPrologue {
  void (*fn)(const void* ctx, int64_t n0, int64_t n1) = nullptr;
  const void* ctx = nullptr;
  void operator()(int64_t n0, int64_t n1) const { fn(ctx, n0, n1); }
};

void conv2d_forward(const ConvAttrs& a, const float* x, const float* w, float* y, float* ws, ThreadPool& pool,
                    bool winograd, const ConvEpilogue* ep = nullptr);
// With `pro`, dy is first written by the prologue: slice by slice inside oneDNN's path, or all of it (over the pool's
// threads) before the im2col path.
void conv2d_backward_data(const ConvAttrs& a, const float* dy, const float* w, float* dx, float* ws, ThreadPool& pool,
                          bool winograd, const ConvPrologue* pro = nullptr);
void conv2d_backward_filter(const ConvAttrs& a, const float* x, const float* dy, float* dw, float* ws, ThreadPool& pool,
                            bool winograd, const ConvPrologue* pro = nullptr);

}  // namespace kiln::cpu
