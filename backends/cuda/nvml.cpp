// NVML through dlopen: the few entry points Kiln uses are declared here, so no NVML header or link is needed.
#include "nvml.hpp"

#include <dlfcn.h>

#include <type_traits>

#include "kiln/allocator.hpp"

namespace kiln::cuda {
namespace {

// From nvml.h (stable ABI since R450; the _v3 process query since R510).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlProcessInfo_v3_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*compute_processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v3_t*) = nullptr;  // optional
  nvmlReturn_t (*process_name)(unsigned int, char*, unsigned int) = nullptr;                        // optional
};

Nvml& Nvml::instance() {
  static Nvml* nvml = new Nvml();  // leaked on purpose: see ~Nvml
  return *nvml;
}

Nvml::Nvml() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    reason_ = std::string("libnvidia-ml.so.1 not loaded (") + (e ? e : "unknown error") + ")";
    return;
  }
  auto api = new Api;
  api->lib = lib;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
  };
  sym(api->init, "nvmlInit_v2");
  sym(api->error_string, "nvmlErrorString");
  sym(api->by_uuid, "nvmlDeviceGetHandleByUUID");
  sym(api->memory_info, "nvmlDeviceGetMemoryInfo");
  sym(api->compute_processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  sym(api->process_name, "nvmlSystemGetProcessName");
  if (!api->init || !api->error_string || !api->by_uuid || !api->memory_info) {
    reason_ = "libnvidia-ml.so.1 lacks nvmlInit_v2/nvmlDeviceGetHandleByUUID/nvmlDeviceGetMemoryInfo";
    delete api;
    return;
  }
  if (const nvmlReturn_t r = api->init(); r != kNvmlSuccess) {
    reason_ = std::string("nvmlInit_v2 failed: ") + api->error_string(r);
    delete api;
    return;
  }
  api_ = api;
}

std::optional<NvmlMemory> Nvml::memory(const std::string& uuid) {
  if (!api_) return std::nullopt;
  std::lock_guard lock(mu_);
  nvmlDevice_t dev = nullptr;
  nvmlMemory_t m{};
  if (api_->by_uuid(uuid.c_str(), &dev) != kNvmlSuccess || api_->memory_info(dev, &m) != kNvmlSuccess)
    return std::nullopt;
  return NvmlMemory{static_cast<size_t>(m.total), static_cast<size_t>(m.free)};
}

std::vector<std::string> Nvml::processes(const std::string& uuid) {
  std::vector<std::string> out;
  if (!api_ || !api_->compute_processes) return out;
  std::lock_guard lock(mu_);
  nvmlDevice_t dev = nullptr;
  if (api_->by_uuid(uuid.c_str(), &dev) != kNvmlSuccess) return out;
  std::vector<nvmlProcessInfo_v3_t> infos(32);
  unsigned int count = static_cast<unsigned int>(infos.size());
  nvmlReturn_t r = api_->compute_processes(dev, &count, infos.data());
  if (r == kNvmlInsufficientSize) {  // count now holds the number needed; leave room for newcomers
    infos.resize(count + 8);
    count = static_cast<unsigned int>(infos.size());
    r = api_->compute_processes(dev, &count, infos.data());
  }
  if (r != kNvmlSuccess) return out;
  for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
    const auto& p = infos[i];
    std::string line = "pid " + std::to_string(p.pid);
    char name[256] = {};
    if (api_->process_name && api_->process_name(p.pid, name, sizeof name) == kNvmlSuccess && name[0])
      line += " (" + std::string(name) + ")";
    line += ": " + (p.usedGpuMemory == kNvmlValueNotAvailable ? std::string("memory n/a")
                                                              : format_bytes(static_cast<size_t>(p.usedGpuMemory)));
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace kiln::cuda
