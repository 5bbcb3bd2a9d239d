// The "cuda" backend: enumerates CUDA devices (without creating contexts when NVML is present) and opens them.
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
  // An empty list comes with unavailable_reason(), e.g. "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable
  // device is detected".
  std::vector<DeviceInfo> enumerate() override;
  std::string unavailable_reason() const override { return reason_; }
  std::unique_ptr<Device> open(int index) override;

 private:
  std::string reason_;
};

}  // namespace kiln::cuda
