#include "cuda_backend.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>

#include "check.hpp"
#include "cuda_device.hpp"
#include "kiln/error.hpp"
#include "visible_devices.hpp"

namespace kiln::cuda {
namespace {

std::string visible_devices_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + v + "\")" : std::string();
}

// cudart reports a missing driver and an old one alike (cudaErrorInsufficientDriver): say which it is.
std::string driver_note(cudaError_t e) {
  if (e != cudaErrorInsufficientDriver) return {};
  if (void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(lib);
    return "; the installed NVIDIA driver (libcuda.so.1) is older than this CUDA runtime (" +
           std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) + ") needs";
  }
  const char* why = dlerror();
  return std::string("; no NVIDIA driver is installed (") + (why ? why : "libcuda.so.1 not found") + ")";
}

}  // namespace

std::vector<DeviceInfo> CudaBackend::enumerate() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    reason_ = "cudaGetDeviceCount: " + cuda_error_text(e) + driver_note(e) + visible_devices_note();
    return {};
  }
  if (count == 0) {
    reason_ = "cudaGetDeviceCount: the driver reports 0 CUDA devices" + visible_devices_note();
    return {};
  }
  if (auto v = visible_devices_env()) {
    const auto entries = parse_visible_devices(*v);
    if (entries.size() > static_cast<size_t>(count))
      throw ConfigError(
          "CUDA_VISIBLE_DEVICES=\"" + *v + "\" names " + std::to_string(entries.size()) + " devices but CUDA sees " +
          std::to_string(count) + ": entry \"" + entries[static_cast<size_t>(count)] +
          "\" does not exist on this host (CUDA ignores it and every entry after it). See `kiln devices`.");
  }
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    DeviceInfo d = describe_device(i);
    int integrated = 0;
    if (cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, i) != cudaSuccess)
      cudaGetLastError();  // Jetson-class
    d.type = integrated ? DeviceType::integrated_gpu : DeviceType::gpu;
    d.host_addressable = false;  // blocks are device addresses
    out.push_back(std::move(d));
  }
  reason_.clear();
  return out;
}

std::unique_ptr<Device> CudaBackend::open(int index) {
  const auto devices = enumerate();
  if (devices.empty()) throw DeviceError("cuda:" + std::to_string(index) + " cannot be opened: " + reason_);
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    std::string have;
    for (const auto& d : devices) have += (have.empty() ? "" : ", ") + d.label() + " (" + d.name + ")";
    throw DeviceError("cuda:" + std::to_string(index) + " does not exist; the CUDA devices present are " + have +
                      visible_devices_note());
  }
  return std::make_unique<CudaDevice>(index, devices[static_cast<size_t>(index)]);
}

}  // namespace kiln::cuda
