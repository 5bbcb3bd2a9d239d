// Error text for the four libraries the CUDA backend calls, and the exported hook tests use to check it.
#include "check.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "kiln/error.hpp"

#ifdef KILN_CUDA_HAVE_NCCL
#include <nccl.h>
#endif

namespace kiln::cuda {
namespace {

const char* library_label(Library lib) {
  switch (lib) {
    case Library::cuda:
      return "CUDA";
    case Library::cublas:
      return "cuBLAS";
    case Library::cudnn:
      return "cuDNN";
    case Library::nccl:
      return "NCCL";
  }
  return "?";
}

// Source paths from the repository root ("backends/cuda/conv.cpp"), not the build machine's absolute path.
std::string_view short_path(const char* file) {
  std::string_view f(file);
  for (std::string_view root : {"/backends/", "/kernels/"}) {
    const size_t at = f.rfind(root);
    if (at != std::string_view::npos) return f.substr(at + 1);
  }
  return f;
}

#ifdef KILN_CUDA_HAVE_NCCL
const char* nccl_name(int code) {
  switch (code) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}
#endif

// What to do about the errors a user can fix.
const char* cuda_hint(int code) {
  switch (code) {
    case cudaErrorInsufficientDriver:
      return "install or upgrade the NVIDIA driver to one that supports this CUDA runtime";
    case cudaErrorNoDevice:
      return "check that the GPU is visible (nvidia-smi) and that CUDA_VISIBLE_DEVICES names existing devices";
    case cudaErrorMemoryAllocation:
      return "lower the batch size or the [device] memory limit of other jobs";
    case cudaErrorDevicesUnavailable:
      return "the device is in exclusive-process mode and used by another process";
    default:
      return nullptr;
  }
}

}  // namespace

std::string cuda_error_text(int code) {
  const auto e = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string format_error(Library lib, int code, const char* call, const char* file, int line) {
  std::string what;
  switch (lib) {
    case Library::cuda:
      what = cuda_error_text(code);
      break;
    case Library::cublas: {
      const auto s = static_cast<cublasStatus_t>(code);
      what = std::string(cublasGetStatusName(s)) + " (" + cublasGetStatusString(s) + ")";
      break;
    }
    case Library::cudnn:
      what = cudnnGetErrorString(static_cast<cudnnStatus_t>(code));
      break;
    case Library::nccl:
#ifdef KILN_CUDA_HAVE_NCCL
      what = std::string(nccl_name(code)) + " (" + ncclGetErrorString(static_cast<ncclResult_t>(code)) + ")";
#else
      what = "NCCL status " + std::to_string(code) + " (this build has no NCCL)";
#endif
      break;
  }
  std::string msg =
      std::string(library_label(lib)) + " call " + call + " failed: " + what + " [status " + std::to_string(code) + "]";
  if (file) msg += " at " + std::string(short_path(file)) + ":" + std::to_string(line);
  if (lib == Library::cuda)
    if (const char* hint = cuda_hint(code)) msg += ". Hint: " + std::string(hint);
  return msg;
}

void throw_error(Library lib, int code, const char* call, const char* file, int line) {
  std::string msg = format_error(lib, code, call, file, line);
  if (lib == Library::cuda) {
    cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  } else if (lib == Library::cudnn) {
    char detail[512] = {};
    cudnnGetLastErrorString(detail, sizeof detail);
    if (detail[0]) msg += " (cuDNN says: " + std::string(detail) + ")";
  }
#ifdef KILN_CUDA_HAVE_NCCL
  else if (lib == Library::nccl) {
    const char* detail = ncclGetLastError(nullptr);
    if (detail && detail[0]) msg += " (NCCL says: " + std::string(detail) + ")";
  }
#endif
  throw DeviceError(msg);
}

}  // namespace kiln::cuda

// Test hook, looked up by name with dlsym: writes the message KILN_<LIB>_CHECK would throw for `code` (library
// is "cuda", "cublas", "cudnn" or "nccl"; file and line are left out). Returns the full length, 0 for an
// unknown library; `out` gets at most cap-1 characters and a NUL.
extern "C" __attribute__((visibility("default"))) size_t kiln_cuda_format_error(const char* library, int code,
                                                                                const char* call, char* out,
                                                                                size_t cap) {
  using kiln::cuda::Library;
  const std::string_view lib = library ? library : "";
  Library l;
  if (lib == "cuda")
    l = Library::cuda;
  else if (lib == "cublas")
    l = Library::cublas;
  else if (lib == "cudnn")
    l = Library::cudnn;
  else if (lib == "nccl")
    l = Library::nccl;
  else
    return 0;
  const std::string msg = kiln::cuda::format_error(l, code, call ? call : "", nullptr, 0);
  if (out && cap > 0) {
    const size_t n = std::min(cap - 1, msg.size());
    std::memcpy(out, msg.data(), n);
    out[n] = '\0';
  }
  return msg.size();
}
