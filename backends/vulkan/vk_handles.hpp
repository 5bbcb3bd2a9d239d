// Move-only RAII owners of Vulkan handles; destructors never throw.
#pragma once
#include <vulkan/vulkan.h>

#include <utility>

namespace kiln::vulkan {

// A handle created from a VkDevice and destroyed with `Destroy(device, handle, nullptr)`.
template <class T, void (*Destroy)(VkDevice, T, const VkAllocationCallbacks*)>
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(VkDevice d, T h) : dev_(d), h_(h) {}
  DeviceHandle(DeviceHandle&& o) noexcept : dev_(o.dev_), h_(std::exchange(o.h_, VK_NULL_HANDLE)) {}
  DeviceHandle& operator=(DeviceHandle&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      h_ = std::exchange(o.h_, VK_NULL_HANDLE);
    }
    return *this;
  }
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  ~DeviceHandle() { reset(); }

  void reset() noexcept {
    if (h_ != VK_NULL_HANDLE) Destroy(dev_, h_, nullptr);
    h_ = VK_NULL_HANDLE;
  }
  T get() const { return h_; }
  const T& get_ref() const { return h_; }  // for calls taking an array of handles
  explicit operator bool() const { return h_ != VK_NULL_HANDLE; }

 private:
  VkDevice dev_ = VK_NULL_HANDLE;
  T h_ = VK_NULL_HANDLE;
};

using Buffer = DeviceHandle<VkBuffer, vkDestroyBuffer>;
using Memory = DeviceHandle<VkDeviceMemory, vkFreeMemory>;
using Fence = DeviceHandle<VkFence, vkDestroyFence>;
using CommandPool = DeviceHandle<VkCommandPool, vkDestroyCommandPool>;
using DescriptorPool = DeviceHandle<VkDescriptorPool, vkDestroyDescriptorPool>;
using DescriptorSetLayout = DeviceHandle<VkDescriptorSetLayout, vkDestroyDescriptorSetLayout>;
using PipelineLayout = DeviceHandle<VkPipelineLayout, vkDestroyPipelineLayout>;
using Pipeline = DeviceHandle<VkPipeline, vkDestroyPipeline>;
using ShaderModule = DeviceHandle<VkShaderModule, vkDestroyShaderModule>;
using PipelineCache = DeviceHandle<VkPipelineCache, vkDestroyPipelineCache>;

// The logical device itself (waits for idle before destruction).
class LogicalDevice {
 public:
  LogicalDevice() = default;
  explicit LogicalDevice(VkDevice d) : d_(d) {}
  LogicalDevice(LogicalDevice&& o) noexcept : d_(std::exchange(o.d_, VK_NULL_HANDLE)) {}
  LogicalDevice& operator=(LogicalDevice&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = std::exchange(o.d_, VK_NULL_HANDLE);
    }
    return *this;
  }
  LogicalDevice(const LogicalDevice&) = delete;
  LogicalDevice& operator=(const LogicalDevice&) = delete;
  ~LogicalDevice() { reset(); }
  void reset() noexcept {
    if (d_ != VK_NULL_HANDLE) {
      vkDeviceWaitIdle(d_);
      vkDestroyDevice(d_, nullptr);
    }
    d_ = VK_NULL_HANDLE;
  }
  VkDevice get() const { return d_; }

 private:
  VkDevice d_ = VK_NULL_HANDLE;
};

// A host-visible buffer with its memory, persistently mapped (staging for transfers).
struct MappedBuffer {
  Buffer buffer;
  Memory memory;
  void* mapped = nullptr;
  size_t bytes = 0;
};

}  // namespace kiln::vulkan
