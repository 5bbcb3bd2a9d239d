// The Vulkan instance (optionally with the Khronos validation layer) and what it knows about each GPU.
#pragma once
#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.hpp"

namespace kiln::vulkan {

// Facts about one physical device, gathered once at enumeration.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  DeviceInfo info;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties memory{};
  size_t max_allocation_bytes = 0;  // VkPhysicalDeviceMaintenance3Properties::maxMemoryAllocationSize
  size_t max_buffer_bytes = 0;      // VkPhysicalDeviceMaintenance4Properties::maxBufferSize (1.3), else unlimited
  uint32_t compute_family = UINT32_MAX;
  bool memory_budget = false;           // VK_EXT_memory_budget
  bool pci_bus_info = false;            // VK_EXT_pci_bus_info
  bool cooperative_matrix_khr = false;  // VK_KHR_cooperative_matrix (reported; no kernel compiled for it yet)
  bool cooperative_matrix_nv = false;   // VK_NV_cooperative_matrix
  // llvmpipe (lavapipe, Vulkan on the CPU) with 8-wide subgroups that support ballot (subgroupBroadcast) in
  // compute shaders: the GEMM then runs its llvmpipe kernel (kernels/vulkan/gemm_lvp.glsl).
  bool llvmpipe_gemm = false;
  // 16-bit storage (mixed precision): VkPhysicalDevice16BitStorageFeatures::storageBuffer16BitAccess, and
  // VkPhysicalDeviceShaderFloat16Int8Features::shaderFloat16 (Vulkan 1.2 or VK_KHR_shader_float16_int8).
  bool storage_16bit = false;
  bool shader_float16 = false;
  bool float16_int8_ext = false;  // VK_KHR_shader_float16_int8 (needed to enable shaderFloat16 below Vulkan 1.2)
  std::string vendor;             // "NVIDIA", "AMD", "Intel", "Mesa (software)", or the PCI vendor id in hex
  std::string describe() const;   // vendor, type, versions, heaps, limits and extensions, one per line
};

class VulkanInstance {
 public:
  // Creates the instance. With `validation`, enables VK_LAYER_KHRONOS_validation (with synchronization
  // validation) and a debug-utils messenger that counts every warning and error. Throws DeviceError.
  static std::shared_ptr<VulkanInstance> create(bool validation);
  ~VulkanInstance();
  VulkanInstance(const VulkanInstance&) = delete;
  VulkanInstance& operator=(const VulkanInstance&) = delete;

  VkInstance get() const { return instance_; }
  bool validation() const { return validation_; }
  // Every physical device with Vulkan 1.1+ and a compute queue, in driver order.
  const std::vector<PhysicalDevice>& devices() const { return devices_; }
  // Validation warnings + errors seen so far (0 when validation is off).
  std::atomic<uint64_t>& validation_messages() { return messages_; }
  // Free bytes of the device-local heaps: budget - usage with VK_EXT_memory_budget, else the heap sizes.
  size_t free_memory(const PhysicalDevice& pd, size_t used_by_us) const;
  // Sends one validation-type error through the debug messenger (vkSubmitDebugUtilsMessageEXT), so tests can
  // check that messages are counted. False when validation is off.
  bool submit_test_message();

 private:
  VulkanInstance() = default;
  void enumerate();

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  bool validation_ = false;
  std::atomic<uint64_t> messages_{0};
  std::vector<PhysicalDevice> devices_;
};

}  // namespace kiln::vulkan
