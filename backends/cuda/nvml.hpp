// The driver's NVML (libnvidia-ml.so.1), loaded at run time when present: free memory without creating a CUDA
// context, and the processes using a device. Optional: every query is best-effort and returns nothing without it.
#pragma once
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kiln::cuda {

struct NvmlMemory {
  size_t total = 0, free = 0;
};

class Nvml {
 public:
  // The process-wide instance; loads and initializes NVML on first use.
  static Nvml& instance();
  bool available() const { return api_ != nullptr; }
  const std::string& unavailable_reason() const { return reason_; }

  // `uuid` is the device UUID as NVML prints it ("GPU-5f1d2c3a-...").
  std::optional<NvmlMemory> memory(const std::string& uuid);
  // "pid 4145 (python3): 892.00 MiB" for each compute process on the device.
  std::vector<std::string> processes(const std::string& uuid);

  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

 private:
  struct Api;
  Nvml();
  ~Nvml() = default;  // never unloads NVML: other threads may still be in a query at exit
  Api* api_ = nullptr;
  std::string reason_;
  std::mutex mu_;
};

}  // namespace kiln::cuda
