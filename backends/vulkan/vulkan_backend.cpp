// The "vulkan" plugin: enumerates every physical device with a compute queue and opens VulkanDevices; registers
// the kernels of kernels/vulkan.
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "kiln/plugin.hpp"
#include "vulkan_device.hpp"
#include "vulkan_kernel.hpp"

namespace kiln::vulkan {

std::vector<VulkanKernelEntry>& vulkan_kernel_list() {
  static std::vector<VulkanKernelEntry> list;
  return list;
}

namespace {

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(const BackendOptions& o) {
    const char* env = std::getenv("KILN_VULKAN_VALIDATION");
    validation_ = o.device.get_bool("validation", false) || (env && std::string(env) == "1");  // [device] validation
  }
  std::string name() const override { return "vulkan"; }
  int priority() const override { return 200; }

  std::vector<DeviceInfo> enumerate() override {
    if (!ensure()) return {};
    std::vector<DeviceInfo> out;
    for (const auto& pd : instance_->devices()) {
      DeviceInfo i = pd.info;
      i.free_memory = instance_->free_memory(pd, 0);
      out.push_back(std::move(i));
    }
    return out;
  }

  std::string unavailable_reason() const override { return reason_; }

  std::unique_ptr<Device> open(int index) override {
    if (!ensure()) throw DeviceError("vulkan: cannot open device " + std::to_string(index) + ": " + reason_);
    const auto& devs = instance_->devices();
    if (index < 0 || index >= static_cast<int>(devs.size())) {
      std::string have;
      for (const auto& d : devs) have += (have.empty() ? "" : ", ") + d.info.label() + " (" + d.info.name + ")";
      throw DeviceError("vulkan: no device " + std::to_string(index) + "; devices present: " + have);
    }
    return std::make_unique<VulkanDevice>(instance_, devs[static_cast<size_t>(index)]);
  }

 private:
  // Creates the instance once; false (with reason_) when there is no driver or no usable device.
  bool ensure() {
    if (instance_) return true;
    if (!reason_.empty()) return false;
    try {
      instance_ = VulkanInstance::create(validation_);
    } catch (const DeviceError& e) {
      reason_ = e.what();
      return false;
    }
    if (instance_->devices().empty()) {
      reason_ =
          "vulkan: the loader found no device with Vulkan 1.1+ and a compute queue (check `vulkaninfo`; "
          "for a CPU device install Mesa's lavapipe, Debian: mesa-vulkan-drivers)";
      instance_.reset();
      return false;
    }
    return true;
  }

  bool validation_ = false;
  std::shared_ptr<VulkanInstance> instance_;
  std::string reason_;
};

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{"vulkan", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT,
                                  "Vulkan compute backend: GLSL kernels compiled to SPIR-V at build time"};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_backend(
      "vulkan", [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<VulkanBackend>(o); });
  std::set<OpKind> seen;
  for (const VulkanKernelEntry& e : vulkan_kernel_list()) {
    const std::optional<OpKind> kind = find_op(e.op);
    if (!kind)
      throw Error(std::string("vulkan: kernels/vulkan registers a kernel for op '") + e.op +
                  "', which no op of this build is called");
    if (!seen.insert(*kind).second)
      throw Error(std::string("vulkan: kernels/vulkan registers two kernels for op '") + e.op + "'");
    reg.add_kernel("vulkan", *kind, e.kernel);
  }
}

}  // namespace
}  // namespace kiln::vulkan

KILN_PLUGIN(kiln::vulkan::descriptor, kiln::vulkan::register_all)
