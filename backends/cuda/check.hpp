// One checking macro per library (CUDA runtime, cuBLAS, cuDNN, NCCL): a failing call throws kiln::DeviceError
// naming the call, the library's error name and text, and where the call was made.
#pragma once
#include <string>

namespace kiln::cuda {

enum class Library { cuda, cublas, cudnn, nccl };

// "cuBLAS call cublasGemmEx(...) failed: CUBLAS_STATUS_INVALID_VALUE (an invalid value was used as an argument)
//  at backends/cuda/gemm.cpp:42". `code` is the library's status value.
std::string format_error(Library lib, int code, const char* call, const char* file, int line);

// Throws DeviceError with format_error's message plus the library's last-error detail where it keeps one.
[[noreturn]] void throw_error(Library lib, int code, const char* call, const char* file, int line);

// "cudaErrorMemoryAllocation: out of memory" for a CUDA runtime status (no throw).
std::string cuda_error_text(int code);

}  // namespace kiln::cuda

// Every library reports success as 0 (cudaSuccess, CUBLAS_STATUS_SUCCESS, CUDNN_STATUS_SUCCESS, ncclSuccess).
#define KILN_CUDA_LIB_CHECK_(lib, call)                                                             \
  do {                                                                                              \
    const int kiln_status_ = static_cast<int>(call);                                                \
    if (kiln_status_ != 0) ::kiln::cuda::throw_error(lib, kiln_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define KILN_CUDA_CHECK(call) KILN_CUDA_LIB_CHECK_(::kiln::cuda::Library::cuda, call)
#define KILN_CUBLAS_CHECK(call) KILN_CUDA_LIB_CHECK_(::kiln::cuda::Library::cublas, call)
#define KILN_CUDNN_CHECK(call) KILN_CUDA_LIB_CHECK_(::kiln::cuda::Library::cudnn, call)
#define KILN_NCCL_CHECK(call) KILN_CUDA_LIB_CHECK_(::kiln::cuda::Library::nccl, call)
