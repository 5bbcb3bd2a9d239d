// Shared pieces of the CUDA kernels: launch sizing, the launch check, block reductions in a fixed order, and the
// launchers other families reuse. A family's own launchers stay in its file (kernels/cuda/<family>.cu) with the
// registration of its ops (cuda_kernel.hpp).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "cuda_kernel.hpp"

namespace kiln::cuda::kernels {

// elementwise.cu: y = value, y = alpha x (y may be x). Also the empty cases of GEMM, convolution and the losses.
void fill(cudaStream_t s, float* y, int64_t n, float value);
void scale(cudaStream_t s, const float* x, float* y, int64_t n, float alpha);

// reduce.cu: y(o, i) = sum_r x(o, r, i) for x viewed as (outer, reduce, inner). Also BiasGrad's dense case (bias.cu).
void reduce_sum(cudaStream_t s, const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner);

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill an H100 several times, never zero.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 8192));
}

// Threads for a block that cooperates on one row of `cols` elements: a warp multiple, 32..256.
inline int row_threads(int64_t cols) {
  int t = 32;
  while (t < 256 && t < cols) t *= 2;
  return t;
}

// Blocks for a grid with one block per row (the reductions, softmax, BiasGrad): 1..65535.
inline unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 65535)); }

// Throws DeviceError naming the kernel when its launch failed (bad configuration, no kernel image, ...).
inline void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_error(Library::cuda, static_cast<int>(e), kernel, file, line);
}
#define KILN_CUDA_LAUNCHED(kernel) ::kiln::cuda::kernels::check_launch(kernel "<<<>>>", __FILE__, __LINE__)

#define KILN_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

// Reduces `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. The
// combination order depends only on blockDim, so results are reproducible run to run.
template <class T, class Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? partial[lane] : T{};
    // Lanes at or past `warps` are never combined into a valid lane, so no identity element is needed.
    for (int o = 16; o > 0; o /= 2) {
      const T other = __shfl_down_sync(0xffffffffu, v, o);
      if (lane + o < warps) v = op(v, other);
    }
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

}  // namespace kiln::cuda::kernels
