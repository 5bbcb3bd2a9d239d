// conv_dnnl.cpp: the convolution through oneDNN where the plugin was built with it and oneDNN takes this geometry
// (false: the caller runs conv.cpp's im2col path; always false without oneDNN).
#pragma once
#include <array>
#include <cstddef>

#include "conv.hpp"
#include "kiln/ops.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

// Workspace in floats, for `threads` threads.
bool dnnl_conv_workspace(OpKind kind, const ConvAttrs& a, int threads, bool winograd, size_t& floats);
// With `ep` (Conv2dForward only), the epilogue too, each slice's images while they are in cache. With `pro`
// (backward data and filter), the prologue produces each slice's dy images right before the slice reads them.
bool dnnl_conv(OpKind kind, const ConvAttrs& a, const float* in0, const float* in1, float* out, float* ws,
               ThreadPool& pool, bool winograd, const ConvEpilogue* ep = nullptr, const ConvPrologue* pro = nullptr);
// Backward data and backward filter of one convolution in one pass over the slices, each slice's dy reordered once for
// both (with `pro`, produced first), in backward filter's workspace (conv.cpp's conv_workspace_floats sizes it to hold
// the pair). dx and dw are bit for bit the two ops'. False (nothing run) where oneDNN does not take both or `ws_floats`
// is smaller.
// 16-bit storage: `types` are the storage types of in0, in1 and out (the Kiln op's order). Supported: in0 and in1
// bf16, out bf16 or float32 (a bf16 layer's products: oneDNN reads bf16 and accumulates in float32; backward filter
// sums its per-thread partials in float32 and rounds dw once). Direct convolution only (oneDNN's Winograd is float32
// only). False where oneDNN has no such primitive for this geometry, or, for dnnl_conv_typed, `ws_floats` is smaller
// than dnnl_conv_typed_workspace said.
bool dnnl_conv_typed_workspace(OpKind kind, const ConvAttrs& a, const std::array<DType, 3>& types, int threads,
                               size_t& floats);
// With `ep` (Conv2dForward into a bf16 y only), the bf16 epilogue of each slice's images right after they are back
// in the plain layout, while in cache: what a fused run of a bf16 layer's conv, bias, ReLU and max pool would call,
// with the conv call's workspace.
bool dnnl_conv_typed(OpKind kind, const ConvAttrs& a, const std::array<DType, 3>& types, const void* in0,
                     const void* in1, void* out, float* ws, size_t ws_floats, ThreadPool& pool,
                     const ConvEpilogueBf16* ep = nullptr, const ConvPrologue* pro = nullptr);
// dnnl_conv_backward_pair on bf16 storage: dy, w, x and dx bf16, dw in ftypes[2] (bf16 or float32); ftypes are the
// backward filter call's (x, dy, dw). In backward filter's workspace (dnnl_conv_typed_workspace sizes it to hold the
// pair); dx and dw bit for bit the two ops'.
bool dnnl_conv_typed_backward_pair(const ConvAttrs& a, const std::array<DType, 3>& ftypes, const void* dy,
                                   const void* w, const void* x, void* dx, void* dw, float* ws, size_t ws_floats,
                                   ThreadPool& pool, const ConvPrologue* pro);
bool dnnl_conv_backward_pair(const ConvAttrs& a, const float* dy, const float* w, const float* x, float* dx, float* dw,
                             float* ws, size_t ws_floats, ThreadPool& pool, bool winograd, const ConvPrologue* pro);

}  // namespace kiln::cpu
