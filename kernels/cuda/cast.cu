// Cast between float32 and the 16-bit storage types (OpKind::Cast), and the launcher the device's conversion path
// uses around kernels that read float32 only (dispatch.cpp). Rounding is the hardware's round-to-nearest-even
// (__float2bfloat16_rn, __float2half_rn: cvt.rn), the same as kiln/half.hpp on the host; a NaN stays a NaN (its
// payload may differ), infinities stay infinities, float16 overflow gives infinity. bf16 <-> f16 goes through
// float32, which holds both exactly, so it rounds once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common.cuh"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda {
namespace kernels {
namespace {

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float load(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T store(float v);
template <>
__device__ __forceinline__ float store<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half store<__half>(float v) {
  return __float2half_rn(v);
}

template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ x, D* __restrict__ y, int64_t n) {
  KILN_GRID_STRIDE(i, n) { y[i] = store<D>(load(x[i])); }
}

template <class S, class D>
void launch(cudaStream_t s, const void* src, void* dst, int64_t n) {
  cast_kernel<S, D><<<grid_for(n), kThreads, 0, s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
  KILN_CUDA_LAUNCHED("cast_kernel");
}

template <class S>
void launch_from(cudaStream_t s, const void* src, void* dst, DType to, int64_t n) {
  switch (to) {
    case DType::f32:
      return launch<S, float>(s, src, dst, n);
    case DType::bf16:
      return launch<S, __nv_bfloat16>(s, src, dst, n);
    case DType::f16:
      return launch<S, __half>(s, src, dst, n);
  }
  throw DeviceError("cast: unknown storage type " + std::to_string(static_cast<int>(to)));
}

// Cast reads and writes exactly the types its attributes name (check_call matched them to the buffers).
bool cast_takes_types(const OpCall&) { return true; }

}  // namespace
}  // namespace kernels

void cast_values(cudaStream_t s, const void* src, DType from, void* dst, DType to, int64_t n) {
  using namespace kernels;
  if (n <= 0 || (from == to && src == dst)) return;
  if (from == to) {  // a copy: no rounding to do
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(from), cudaMemcpyDeviceToDevice, s));
    return;
  }
  switch (from) {
    case DType::f32:
      return launch_from<float>(s, src, dst, to, n);
    case DType::bf16:
      return launch_from<__nv_bfloat16>(s, src, dst, to, n);
    case DType::f16:
      return launch_from<__half>(s, src, dst, to, n);
  }
  throw DeviceError("cast: unknown storage type " + std::to_string(static_cast<int>(from)));
}

namespace kernels {

KILN_CUDA_KERNELS(cast) {
  register_cuda_kernel(OpKind::Cast, {.run =
                                          [](const CudaOp& op) {
                                            const auto& a = op.attrs<CastAttrs>();
                                            cast_values(op.stream, op.raw_in(0), a.from, op.raw_out(0), a.to, a.count);
                                          },
                                      .takes_types = cast_takes_types});
}

}  // namespace kernels
}  // namespace kiln::cuda
