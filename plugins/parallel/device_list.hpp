// Devices of backends the host did not open. [device] opens one backend; a strategy that lists "vulkan:0" next to
// "cpu:0" opens the other backend's devices itself, through the registry, each with its own allocator.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "kiln/allocator.hpp"
#include "kiln/plugin.hpp"

namespace kiln::parallel {

class ExtraDevices {
 public:
  // `memory_limit` ("2GiB", "50%", "" = the whole device) caps each device opened here.
  ExtraDevices(const Registry* reg, std::string memory_limit, std::string where)
      : reg_(reg), memory_limit_(std::move(memory_limit)), where_(std::move(where)) {}
  ExtraDevices(const ExtraDevices&) = delete;
  ExtraDevices& operator=(const ExtraDevices&) = delete;

  // `ctx` with its device list extended by every labelled entry whose backend is not open there (opened now, or
  // reused from an earlier call). Entries of an opened backend are left for resolve_devices to check.
  RunnerContext extend(const RunnerContext& ctx, const std::vector<DeviceEntry>& entries);

 private:
  const Registry* reg_;
  std::string memory_limit_, where_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  // Declared after the backends and before the allocators: allocators go first, backends last.
  std::map<std::string, std::unique_ptr<Device>> devices_;  // by label
  std::map<std::string, std::unique_ptr<Allocator>> allocators_;
};

}  // namespace kiln::parallel
