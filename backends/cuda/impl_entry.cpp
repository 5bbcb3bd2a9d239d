// The entries of cuda/libkiln_cuda_impl.so that the "cuda" plugin (plugin.cpp) looks up when it first needs the
// backend or the NCCL communicator (in one process or across a process group). Ownership passes to the caller (a
// std::unique_ptr there); errors are thrown as Kiln's exceptions, whose types live in libkiln_core, shared by both
// libraries.
#include "cuda_backend.hpp"
#include "cuda_kernel.hpp"
#include "kiln/strategy.hpp"
#ifdef KILN_CUDA_HAVE_NCCL
#include "nccl_communicator.hpp"
#endif

// Registers the built-in ops' kernels for "cuda" (every KILN_CUDA_KERNELS family of kernels/cuda), once. The plugin
// calls it right after loading this library, before it makes anything.
extern "C" __attribute__((visibility("default"))) void kiln_cuda_register_kernels() {
  kiln::cuda::register_builtin_kernels();
}

extern "C" __attribute__((visibility("default"))) kiln::Backend* kiln_cuda_make_backend(const kiln::BackendOptions* o) {
  return new kiln::cuda::CudaBackend(*o);
}

#ifdef KILN_CUDA_HAVE_NCCL
extern "C" __attribute__((visibility("default"))) kiln::Communicator* kiln_cuda_make_nccl(kiln::Device* const* devices,
                                                                                          size_t count) {
  return kiln::cuda::make_nccl_communicator(std::span<kiln::Device* const>(devices, count)).release();
}

extern "C" __attribute__((visibility("default"))) kiln::Communicator* kiln_cuda_make_nccl_group(
    kiln::Device* const* devices, size_t count, kiln::ProcessGroup* group) {
  return kiln::cuda::make_nccl_group_communicator(std::span<kiln::Device* const>(devices, count), *group).release();
}
#endif
