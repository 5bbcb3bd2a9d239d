#include "encoder.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/error.hpp"
#include "vk_check.hpp"

namespace kiln::vulkan {

// Grid-stride kernels get at most this many workgroups: enough to fill any GPU, and on llvmpipe, where each
// workgroup has a fixed cost, more work per invocation.
constexpr uint32_t kMaxGridGroups = 4096;

uint32_t Encoder::groups_for(int64_t n, uint32_t local) const {
  if (n <= 0) return 0;
  const int64_t want = (n + local - 1) / local;
  return static_cast<uint32_t>(std::min<int64_t>(want, std::min<uint32_t>(kMaxGridGroups, limits_.max_groups[0])));
}

void Encoder::copy(const BufferView& src, const BufferView& dst) {
  if (src.bytes == 0 || (src.block == dst.block && src.offset == dst.offset)) return;
  if (src.overlaps(dst)) throw DeviceError("vulkan: copy source and destination overlap");
  VkBuffer sb = static_cast<VkBuffer>(src.block->native), db = static_cast<VkBuffer>(dst.block->native);
  stream_.hazard({Range{sb, src.offset, src.offset + src.bytes}}, {Range{db, dst.offset, dst.offset + src.bytes}});
  const VkBufferCopy region{src.offset, dst.offset, src.bytes};
  vkCmdCopyBuffer(stream_.cmd(), sb, db, 1, &region);
}

void Encoder::dispatch_shader(const ShaderKernel& k, std::span<const Bind> binds, const std::vector<uint32_t>& params,
                              uint32_t gx, uint32_t gy, uint32_t gz) {
  if (params.size() * 4 > kPushConstantBytes - 32)
    throw DeviceError("vulkan: kernel " + k.name + " passes " + std::to_string(params.size()) +
                      " parameter words, the push-constant block holds " +
                      std::to_string((kPushConstantBytes - 32) / 4));
  if (binds.size() > 8)
    throw DeviceError("vulkan: kernel " + k.name + " binds " + std::to_string(binds.size()) + " buffers, at most 8");
  dispatch_raw(k.name.c_str(), binds, params.data(), params.size() * 4, gx, gy, gz, &k.spirv);
}

void Encoder::dispatch_raw(const char* name, std::span<const Bind> binds, const void* params, size_t bytes, uint32_t gx,
                           uint32_t gy, uint32_t gz, const std::vector<uint32_t>* spirv) {
  if (gx == 0 || gy == 0 || gz == 0) return;
  const KernelPipeline& k = kernels_.get(name, spirv);
  if (binds.size() != k.bindings)
    throw DeviceError(std::string("vulkan: kernel ") + name + " declares " + std::to_string(k.bindings) +
                      " buffers, the op bound " + std::to_string(binds.size()));
  if (gx > limits_.max_groups[0] || gy > limits_.max_groups[1] || gz > limits_.max_groups[2])
    throw DeviceError(std::string("vulkan: kernel ") + name + " needs " + std::to_string(gx) + "x" +
                      std::to_string(gy) + "x" + std::to_string(gz) + " workgroups, above maxComputeWorkGroupCount");

  std::vector<VkDescriptorBufferInfo> infos;
  std::vector<Range> reads, writes;
  uint32_t push[kPushConstantBytes / 4] = {};
  uint32_t slot = 0;
  for (const Bind& b : binds) {
    const BufferView& v = b.view;
    if (v.bytes == 0 || !v.block) {  // nothing is read or written; any valid descriptor will do
      infos.push_back({dummy_, 0, VK_WHOLE_SIZE});
      ++slot;
      continue;
    }
    if (v.offset % 4 != 0)
      throw DeviceError(std::string("vulkan: kernel ") + name + " binding " + std::to_string(slot) + ": offset " +
                        std::to_string(v.offset) + " is not a multiple of 4 (f32 elements)");
    // Descriptors need aligned offsets: bind from the aligned-down offset, pass the rest as an element base.
    const size_t aligned = v.offset - v.offset % limits_.offset_align;
    const size_t range = v.bytes + (v.offset - aligned);
    if (range > limits_.max_range)
      throw DeviceError(std::string("vulkan: kernel ") + name + " binding " + std::to_string(slot) + ": " +
                        std::to_string(range) + " bytes exceed maxStorageBufferRange (" +
                        std::to_string(limits_.max_range) + ")");
    VkBuffer buf = static_cast<VkBuffer>(v.block->native);
    infos.push_back({buf, aligned, range});
    push[slot] = static_cast<uint32_t>((v.offset - aligned) / 4);
    const Range r{buf, v.offset, v.offset + v.bytes};
    if (b.access == Access::read || b.access == Access::read_write) reads.push_back(r);
    if (b.access == Access::write || b.access == Access::read_write) writes.push_back(r);
    ++slot;
  }
  if (bytes) std::memcpy(push + 8, params, bytes);

  stream_.hazard(reads, writes);
  VkDescriptorSet set = stream_.allocate_set(k.set_layout.get());
  std::vector<VkWriteDescriptorSet> w(infos.size());
  for (uint32_t i = 0; i < infos.size(); ++i) {
    w[i] = vk_init<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    w[i].dstSet = set;
    w[i].dstBinding = i;
    w[i].descriptorCount = 1;
    w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(stream_.device(), static_cast<uint32_t>(w.size()), w.data(), 0, nullptr);
  VkCommandBuffer cb = stream_.cmd();
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline.get());
  vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout.get(), 0, 1, &set, 0, nullptr);
  vkCmdPushConstants(cb, k.layout.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes, push);
  vkCmdDispatch(cb, gx, gy, gz);
}

}  // namespace kiln::vulkan
