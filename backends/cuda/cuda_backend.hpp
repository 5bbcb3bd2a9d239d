// The "cuda" backend's runtime part: enumerates CUDA devices (without creating contexts when NVML is present) and
// opens them. plugin.cpp's front backend makes it on first use and forwards to it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.hpp"

namespace kiln::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions&) {}
  std::string name() const override { return "cuda"; }
  int priority() const override { return 300; }
  // An empty list comes with unavailable_reason(), e.g. "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable
  // device is detected". Throws ConfigError when CUDA_VISIBLE_DEVICES names more devices than CUDA sees (CUDA
  // dropped an entry it could not use and every one after it).
  std::vector<DeviceInfo> enumerate() override;
  std::string unavailable_reason() const override { return reason_; }
  std::unique_ptr<Device> open(int index) override;

 private:
  std::string reason_;
};

}  // namespace kiln::cuda
