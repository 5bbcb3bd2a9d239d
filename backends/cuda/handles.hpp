// Move-only owners of driver and library handles; destructors never throw (a failing destroy is ignored: the
// context is going away or already broken, and the original error was reported where it happened).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <utility>

namespace kiln::cuda {

template <class T, auto Destroy>
class Unique {
 public:
  Unique() = default;
  explicit Unique(T h) : h_(h) {}
  Unique(Unique&& o) noexcept : h_(std::exchange(o.h_, T{})) {}
  Unique& operator=(Unique&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, T{});
    }
    return *this;
  }
  Unique(const Unique&) = delete;
  Unique& operator=(const Unique&) = delete;
  ~Unique() { reset(); }

  T get() const { return h_; }
  explicit operator bool() const { return h_ != T{}; }
  void reset(T h = T{}) noexcept {
    if (h_ != T{}) static_cast<void>(Destroy(h_));
    h_ = h;
  }

 private:
  T h_{};
};

using StreamHandle = Unique<cudaStream_t, cudaStreamDestroy>;
using EventHandle = Unique<cudaEvent_t, cudaEventDestroy>;
using GraphExecHandle = Unique<cudaGraphExec_t, cudaGraphExecDestroy>;
using GraphHandle = Unique<cudaGraph_t, cudaGraphDestroy>;
using CublasHandle = Unique<cublasHandle_t, cublasDestroy>;
using CudnnHandle = Unique<cudnnHandle_t, cudnnDestroy>;
using TensorDesc = Unique<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Unique<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Unique<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using DeviceMemory = Unique<void*, cudaFree>;
using PinnedMemory = Unique<void*, cudaFreeHost>;

}  // namespace kiln::cuda
