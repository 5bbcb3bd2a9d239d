// Moving bf16 tensors between plain NCHW and oneDNN's 16-channel blocks (aBcd16b), for conv_dnnl.cpp.
// oneDNN 2.6 reorders bf16 between those layouts with its generic jit:uni kernel: on the CNN sample at batch 256 those
// reorders took about 10 of a bf16 step's 25 ms over its 2 threads, more than the float32 step's (jit:blk). Both
// directions are 16 x 16 transposes of 16-bit values, done here instead (AVX2 where the CPU has it): the bytes are
// only moved, so the result is oneDNN's bit for bit.
#pragma once
#include <cstdint>

namespace kiln::cpu {

// Which way a tensor goes (none: oneDNN reorders it, or it needs no reorder).
enum class Reorder16 : uint8_t { none, to_blocked, from_blocked };

// The dims of a plain 4-d tensor: n, channels (a multiple of 16), and the pixels of one channel.
struct Dims16 {
  int64_t n = 0, c = 0, hw = 0;
};

// Plain NCHW to 16-channel blocks, or back: both layouts put channel block b of image i at the same offset
// ((i * c + 16 b) * hw), so each block is one transpose of 16 rows. Coming back (from_blocked) into a bf16 layer's y,
// the bias (one float32 per channel, or null) is added as BiasAdd on bf16 storage adds it (in float32, rounded once
// as kiln/half.hpp's float_to_bf16), then with relu ActivationForward's ReLU is applied on the bf16 bits: a fused
// conv + bias + ReLU stores the unfused ops' bits.
void blocked16(Reorder16 dir, const Dims16& d, const uint16_t* from, uint16_t* to, const float* bias = nullptr,
               bool relu = false);

// Columns [cb, ce) of x (rows, cols) into rows [cb, ce) of y (cols, rows), 16-bit values: the same 16 x 16 transposes
// where a tile is whole, the edges one value at a time (gemm.cpp's copy of a transposed bf16 operand).
void transpose16_cols(const uint16_t* x, int64_t rows, int64_t cols, uint16_t* y, int64_t cb, int64_t ce);

}  // namespace kiln::cpu
