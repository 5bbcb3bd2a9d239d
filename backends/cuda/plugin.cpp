// The "cuda" plugin's entry: descriptor + registration of the backend and the NCCL communicator.
#include <memory>

#include "cuda_backend.hpp"
#include "kiln/plugin.hpp"
#include "nccl_communicator.hpp"

namespace kiln::cuda {

const PluginDescriptor* descriptor() {
#ifdef KILN_CUDA_HAVE_NCCL
  static const char* what = "CUDA backend: cuBLAS GEMM, cuDNN convolutions, CUDA kernels and graphs, NCCL communicator";
#else
  static const char* what = "CUDA backend: cuBLAS GEMM, cuDNN convolutions, CUDA kernels and graphs (built without NCCL)";
#endif
  static const PluginDescriptor d{"cuda", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT, what};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_backend("cuda", [](const BackendOptions& o) -> std::unique_ptr<Backend> {
    return std::make_unique<CudaBackend>(o);
  });
#ifdef KILN_CUDA_HAVE_NCCL
  reg.add_communicator("nccl", [](std::span<Device* const> devices) -> std::unique_ptr<Communicator> {
    return make_nccl_communicator(devices);
  });
#endif
}

}  // namespace kiln::cuda

KILN_PLUGIN(kiln::cuda::descriptor, kiln::cuda::register_all)
