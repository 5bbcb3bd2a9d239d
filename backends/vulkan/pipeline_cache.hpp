// Compute pipelines built from the SPIR-V embedded at build time, created on first use and cached.
#pragma once
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "vk_handles.hpp"

namespace kiln::vulkan {

// One SPIR-V module compiled from kernels/vulkan/<name>.comp (generated source: kernels_spirv.cpp).
struct SpirvKernel {
  const char* name;
  const uint32_t* words;
  size_t word_count;
};
extern const SpirvKernel kSpirvKernels[];
extern const size_t kSpirvKernelCount;

// Every kernel takes storage buffers at set 0, bindings 0..bindings-1, and one push-constant block.
inline constexpr uint32_t kPushConstantBytes = 128;

struct KernelPipeline {
  std::string name;
  uint32_t bindings = 0;
  DescriptorSetLayout set_layout;
  PipelineLayout layout;
  ShaderModule module;
  Pipeline pipeline;
};

class KernelCache {
 public:
  explicit KernelCache(VkDevice device);
  // The pipeline of kernel `name`; throws DeviceError naming the kernels built into this plugin if absent.
  // `spirv` supplies the module of a kernel that is not built in (a plugin's ShaderKernel).
  const KernelPipeline& get(const std::string& name, const std::vector<uint32_t>* spirv = nullptr);
  size_t created() const { return pipelines_.size(); }
  static std::vector<std::string> names();

 private:
  VkDevice device_;
  PipelineCache cache_;
  std::map<std::string, std::unique_ptr<KernelPipeline>> pipelines_;
};

// Number of storage-buffer bindings a SPIR-V module declares (highest Binding decoration + 1).
uint32_t spirv_binding_count(const uint32_t* words, size_t count);

}  // namespace kiln::vulkan
