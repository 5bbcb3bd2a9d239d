// A Vulkan device: device-local blocks for the core Allocator, staged copies, ops recorded in batches.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "command_stream.hpp"
#include "dispatch.hpp"
#include "encoder.hpp"
#include "kiln/device.hpp"
#include "pipeline_cache.hpp"
#include "vk_handles.hpp"
#include "vk_instance.hpp"

namespace kiln::vulkan {

class VulkanDevice final : public Device {
 public:
  VulkanDevice(std::shared_ptr<VulkanInstance> instance, const PhysicalDevice& pd);
  ~VulkanDevice() override;

  const DeviceInfo& info() const override { return info_; }
  size_t query_free_memory() override;
  Block* allocate_block(size_t bytes) override;
  void free_block(Block* b) noexcept override;
  size_t workspace_bytes(const OpCall& call) const override;
  // bfloat16 with storageBuffer16BitAccess; float16 with that and shaderFloat16 (both enabled at creation).
  Support supports_dtype(DType t) const override;
  void synchronize() override;
  // Ops between begin and end go into one command buffer (no batch-limit submits), submitted at the end.
  void begin_sequence(uint64_t step_id) override;
  void end_sequence() override;
  // "validation.message_count" -> std::atomic<uint64_t>* (validation on only); "vulkan.submissions" -> const uint64_t*
  // (batches submitted so far); "vulkan.pipelines" -> const uint64_t* (pipelines created so far); "vulkan.vendor" ->
  // const char* ("NVIDIA", "Mesa (software)", ...); "vulkan.describe" -> const char* (vendor, type, heaps, budget,
  // limits and extensions, one per line); "vulkan.debug.submit_test_message" sends one error through the validation
  // messenger (a self-test of the counting) and returns the counter, or nullptr when validation is off.
  void* extension(std::string_view name) override;

 protected:
  // Copies, supports and run arrive checked (Device, device.hpp); what remains is whether each block is this
  // device's memory (a foreign VkBuffer would crash the driver, not raise an error).
  void do_copy_from_host(const void* src, const BufferView& dst) override;
  void do_copy_to_host(const BufferView& src, void* dst) override;
  void do_copy_on_device(const BufferView& src, const BufferView& dst) override;
  bool runs_kernel(const Kernel& k) const override;  // VulkanKernel, a plugin's ShaderKernel
  Support do_supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k) const override;
  bool do_run(const OpCall& call) override;

 private:
  struct DeviceBlock {
    Block block;
    Buffer buffer;
    Memory memory;
  };
  // Throws DeviceError when v (of n > 0 bytes, inside its block: Device checked that) is not memory of this device.
  void check_owned(const BufferView& v, const char* what) const;
  uint32_t find_memory_type(uint32_t allowed, VkMemoryPropertyFlags need, VkMemoryPropertyFlags prefer) const;
  std::unique_ptr<DeviceBlock> make_block(size_t bytes);  // nullptr when the device is out of memory
  Encoder encoder() { return Encoder(*stream_, *kernels_, limits_, static_cast<VkBuffer>(dummy_->block.native)); }

  std::shared_ptr<VulkanInstance> instance_;
  PhysicalDevice pd_;
  DeviceInfo info_;
  DeviceLimits limits_;
  LogicalDevice device_;  // destroyed after everything below
  VkQueue queue_ = VK_NULL_HANDLE;
  std::map<const Block*, std::unique_ptr<DeviceBlock>> blocks_;
  std::unique_ptr<DeviceBlock> dummy_;  // bound where a kernel's buffer is empty
  std::unique_ptr<KernelCache> kernels_;
  OpKernels ops_;
  std::unique_ptr<CommandStream> stream_;
  size_t allocated_bytes_ = 0;
  uint64_t next_block_id_ = 1;
  uint64_t submissions_ = 0, pipelines_ = 0;  // snapshots for extension()
  std::string description_;
};

}  // namespace kiln::vulkan
