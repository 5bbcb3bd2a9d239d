#include "pipeline_cache.hpp"

#include <algorithm>
#include <cstring>

#include "kiln/error.hpp"
#include "vk_check.hpp"

namespace kiln::vulkan {

uint32_t spirv_binding_count(const uint32_t* words, size_t count) {
  constexpr uint32_t kOpDecorate = 71, kDecorationBinding = 33;
  uint32_t n = 0;
  for (size_t i = 5; i < count;) {  // the header is 5 words; each instruction starts with (length << 16 | opcode)
    const uint32_t len = words[i] >> 16, op = words[i] & 0xffffu;
    if (len == 0) break;
    if (op == kOpDecorate && len >= 4 && words[i + 2] == kDecorationBinding) n = std::max(n, words[i + 3] + 1);
    i += len;
  }
  return n;
}

std::vector<std::string> KernelCache::names() {
  std::vector<std::string> v;
  for (size_t i = 0; i < kSpirvKernelCount; ++i) v.emplace_back(kSpirvKernels[i].name);
  return v;
}

KernelCache::KernelCache(VkDevice device) : device_(device) {
  auto ci = vk_init<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  VkPipelineCache c;
  KILN_VK_CHECK(vkCreatePipelineCache(device_, &ci, nullptr, &c));
  cache_ = PipelineCache(device_, c);
}

const KernelPipeline& KernelCache::get(const std::string& name, const std::vector<uint32_t>* spirv) {
  auto it = pipelines_.find(name);
  if (it != pipelines_.end()) return *it->second;
  const SpirvKernel* spv = nullptr;
  for (size_t i = 0; i < kSpirvKernelCount; ++i)
    if (name == kSpirvKernels[i].name) spv = &kSpirvKernels[i];
  SpirvKernel external{name.c_str(), nullptr, 0};
  if (!spv && spirv) {
    if (spirv->size() < 5 || (*spirv)[0] != 0x07230203u)
      throw DeviceError("vulkan: kernel '" + name + "' is not a SPIR-V module (no SPIR-V magic number)");
    external.words = spirv->data();
    external.word_count = spirv->size();
    spv = &external;
  }
  if (!spv) {
    std::string all;
    for (const auto& n : names()) all += (all.empty() ? "" : ", ") + n;
    throw DeviceError("vulkan: no kernel named '" + name + "' is built into this plugin (have: " + all + ")");
  }
  auto k = std::make_unique<KernelPipeline>();
  k->name = name;
  k->bindings = spirv_binding_count(spv->words, spv->word_count);

  std::vector<VkDescriptorSetLayoutBinding> binds(k->bindings);
  for (uint32_t i = 0; i < k->bindings; ++i)
    binds[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  auto li = vk_init<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  li.bindingCount = k->bindings;
  li.pBindings = binds.data();
  VkDescriptorSetLayout sl;
  KILN_VK_CHECK(vkCreateDescriptorSetLayout(device_, &li, nullptr, &sl));
  k->set_layout = DescriptorSetLayout(device_, sl);

  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  auto pli = vk_init<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &sl;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pr;
  VkPipelineLayout pl;
  KILN_VK_CHECK(vkCreatePipelineLayout(device_, &pli, nullptr, &pl));
  k->layout = PipelineLayout(device_, pl);

  auto mi = vk_init<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  mi.codeSize = spv->word_count * 4;
  mi.pCode = spv->words;
  VkShaderModule sm;
  KILN_VK_CHECK(vkCreateShaderModule(device_, &mi, nullptr, &sm));
  k->module = ShaderModule(device_, sm);

  auto ci = vk_init<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage = vk_init<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = sm;
  ci.stage.pName = "main";
  ci.layout = pl;
  VkPipeline p;
  KILN_VK_CHECK(vkCreateComputePipelines(device_, cache_.get(), 1, &ci, nullptr, &p));
  k->pipeline = Pipeline(device_, p);
  return *pipelines_.emplace(name, std::move(k)).first->second;
}

}  // namespace kiln::vulkan
