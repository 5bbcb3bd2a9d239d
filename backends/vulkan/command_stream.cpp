#include "command_stream.hpp"

#include <algorithm>

#include "kiln/error.hpp"
#include "vk_check.hpp"

namespace kiln::vulkan {
namespace {

constexpr size_t kBatches = 3;
constexpr uint32_t kSetsPerPool = 128;
constexpr uint32_t kMaxBindings = 8;
constexpr uint64_t kFenceTimeoutNs = 600ull * 1000 * 1000 * 1000;  // a batch running 10 minutes is a hang
constexpr size_t kStagingAlign = 16;

constexpr VkPipelineStageFlags kWorkStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

std::unique_ptr<MappedBuffer> make_mapped(VkDevice dev, uint32_t type, size_t bytes) {
  auto m = std::make_unique<MappedBuffer>();
  auto bi = vk_init<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer b;
  KILN_VK_CHECK(vkCreateBuffer(dev, &bi, nullptr, &b));
  m->buffer = Buffer(dev, b);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, b, &req);
  if (!(req.memoryTypeBits & (1u << type)))
    throw DeviceError("vulkan: the staging memory type " + std::to_string(type) +
                      " cannot back a transfer buffer (allowed types mask " + std::to_string(req.memoryTypeBits) + ")");
  auto ai = vk_init<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  VkDeviceMemory mem;
  KILN_VK_CHECK(vkAllocateMemory(dev, &ai, nullptr, &mem));
  m->memory = Memory(dev, mem);
  KILN_VK_CHECK(vkBindBufferMemory(dev, b, mem, 0));
  KILN_VK_CHECK(vkMapMemory(dev, mem, 0, VK_WHOLE_SIZE, 0, &m->mapped));
  m->bytes = bytes;
  return m;
}

}  // namespace

struct CommandStream::Batch {
  VkCommandBuffer cb = VK_NULL_HANDLE;
  Fence fence;
  std::vector<DescriptorPool> pools;
  size_t pool = 0;
  std::vector<std::unique_ptr<MappedBuffer>> chunks;     // staging chunks; the last one is being filled
  std::vector<std::unique_ptr<MappedBuffer>> dedicated;  // staging bigger than a chunk
  size_t chunk_used = 0;
  size_t staging_bytes = 0;
  uint32_t ops = 0;
  bool in_flight = false;
};

CommandStream::CommandStream(VkDevice device, VkQueue queue, StreamConfig cfg)
    : device_(device), queue_(queue), cfg_(cfg) {
  auto pi = vk_init<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = cfg_.queue_family;
  VkCommandPool pool;
  KILN_VK_CHECK(vkCreateCommandPool(device_, &pi, nullptr, &pool));
  pool_ = CommandPool(device_, pool);
  for (size_t i = 0; i < kBatches; ++i) {
    auto b = std::make_unique<Batch>();
    auto ai = vk_init<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = pool_.get();
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    KILN_VK_CHECK(vkAllocateCommandBuffers(device_, &ai, &b->cb));
    auto fi = vk_init<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    VkFence f;
    KILN_VK_CHECK(vkCreateFence(device_, &fi, nullptr, &f));
    b->fence = Fence(device_, f);
    batches_.push_back(std::move(b));
  }
}

CommandStream::~CommandStream() {
  // Nothing recorded may outlive the stream: wait for the GPU, never throw.
  for (auto& b : batches_)
    if (b->in_flight) vkWaitForFences(device_, 1, &b->fence.get_ref(), VK_TRUE, kFenceTimeoutNs);
}

DescriptorPool CommandStream::make_descriptor_pool() {
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
  auto ci = vk_init<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
  ci.maxSets = kSetsPerPool;
  ci.poolSizeCount = 1;
  ci.pPoolSizes = &size;
  VkDescriptorPool p;
  KILN_VK_CHECK(vkCreateDescriptorPool(device_, &ci, nullptr, &p));
  return DescriptorPool(device_, p);
}

void CommandStream::wait(Batch& b) {
  if (!b.in_flight) return;
  KILN_VK_CHECK(vkWaitForFences(device_, 1, &b.fence.get_ref(), VK_TRUE, kFenceTimeoutNs));
  b.in_flight = false;
}

void CommandStream::recycle(Batch& b) {
  for (auto& p : b.pools) KILN_VK_CHECK(vkResetDescriptorPool(device_, p.get(), 0));
  b.pool = 0;
  for (auto& c : b.chunks)  // keep a few chunks for the next batches, drop the rest
    if (free_chunks_.size() < 4) free_chunks_.push_back(std::move(c));
  b.chunks.clear();
  b.dedicated.clear();
  b.chunk_used = 0;
  b.staging_bytes = 0;
  b.ops = 0;
  KILN_VK_CHECK(vkResetFences(device_, 1, &b.fence.get_ref()));
  KILN_VK_CHECK(vkResetCommandBuffer(b.cb, 0));
}

CommandStream::Batch& CommandStream::current() {
  if (recording_) return *recording_;
  Batch& b = *batches_[next_];
  wait(b);
  recycle(b);
  auto bi = vk_init<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  KILN_VK_CHECK(vkBeginCommandBuffer(b.cb, &bi));
  recording_ = &b;
  reads_.clear();
  writes_.clear();
  barrier();  // orders this batch after the work of earlier submissions on the queue
  return b;
}

VkCommandBuffer CommandStream::cmd() { return current().cb; }

VkDescriptorSet CommandStream::allocate_set(VkDescriptorSetLayout layout) {
  Batch& b = current();
  for (;;) {
    if (b.pool == b.pools.size()) b.pools.push_back(make_descriptor_pool());
    auto ai = vk_init<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    ai.descriptorPool = b.pools[b.pool].get();
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set;
    const VkResult r = vkAllocateDescriptorSets(device_, &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL)
      vk_fail("vkAllocateDescriptorSets(device_, &ai, &set)", r, __FILE__, __LINE__);
    ++b.pool;  // this pool is full: move on to the next (created on demand)
  }
}

StagingSlice CommandStream::staging(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  if (recording_ && recording_->staging_bytes > 0 && recording_->staging_bytes + bytes > cfg_.staging_per_batch)
    submit();
  Batch& b = current();
  b.staging_bytes += bytes;
  if (bytes > cfg_.staging_chunk) {
    b.dedicated.push_back(make_mapped(device_, cfg_.staging_memory_type, bytes));
    return {b.dedicated.back()->buffer.get(), 0, b.dedicated.back()->mapped};
  }
  if (b.chunks.empty() || b.chunk_used + bytes > cfg_.staging_chunk) {
    if (!free_chunks_.empty()) {
      b.chunks.push_back(std::move(free_chunks_.back()));
      free_chunks_.pop_back();
    } else {
      b.chunks.push_back(make_mapped(device_, cfg_.staging_memory_type, cfg_.staging_chunk));
    }
    b.chunk_used = 0;
  }
  MappedBuffer& c = *b.chunks.back();
  StagingSlice s{c.buffer.get(), b.chunk_used, static_cast<char*>(c.mapped) + b.chunk_used};
  b.chunk_used += bytes;
  return s;
}

void CommandStream::barrier() {
  auto mb = vk_init<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(current().cb, kWorkStages, kWorkStages, 0, 1, &mb, 0, nullptr, 0, nullptr);
  reads_.clear();
  writes_.clear();
}

void CommandStream::hazard(const std::vector<Range>& reads, const std::vector<Range>& writes) {
  current();
  auto hits = [](const std::vector<Range>& a, const std::vector<Range>& b) {
    for (const auto& x : a)
      for (const auto& y : b)
        if (x.overlaps(y)) return true;
    return false;
  };
  // Read-after-write, write-after-write, write-after-read; the lists are short (cleared at each barrier).
  if (hits(reads, writes_) || hits(writes, writes_) || hits(writes, reads_) || reads_.size() + writes_.size() > 256)
    barrier();
  reads_.insert(reads_.end(), reads.begin(), reads.end());
  writes_.insert(writes_.end(), writes.begin(), writes.end());
}

void CommandStream::end_op() {
  Batch& b = current();
  if (++b.ops >= cfg_.ops_per_batch && !in_sequence_) submit();
}

void CommandStream::end_sequence() {
  in_sequence_ = false;
  submit();
}

void CommandStream::submit() {
  if (!recording_) return;
  Batch& b = *recording_;
  recording_ = nullptr;
  KILN_VK_CHECK(vkEndCommandBuffer(b.cb));
  auto si = vk_init<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &b.cb;
  KILN_VK_CHECK(vkQueueSubmit(queue_, 1, &si, b.fence.get()));
  b.in_flight = true;
  ++submissions_;
  next_ = (next_ + 1) % batches_.size();
}

void CommandStream::finish(bool host_read) {
  if (host_read && recording_) {
    auto mb = vk_init<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(recording_->cb, kWorkStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }
  submit();
  for (auto& b : batches_) wait(*b);
}

}  // namespace kiln::vulkan
