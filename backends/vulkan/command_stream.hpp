// Records ops into command buffers and submits them in batches: one queue, a ring of batches, each with its
// fence, descriptor pools and host-visible staging. Barriers come from hazard tracking on buffer ranges.
#pragma once
#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vk_handles.hpp"

namespace kiln::vulkan {

// A byte range of a VkBuffer an op reads or writes (for hazard tracking).
struct Range {
  VkBuffer buffer = VK_NULL_HANDLE;
  size_t begin = 0, end = 0;
  bool overlaps(const Range& o) const { return buffer == o.buffer && begin < o.end && o.begin < end; }
};

// Host-visible bytes valid until the batch that took them has completed.
struct StagingSlice {
  VkBuffer buffer = VK_NULL_HANDLE;
  size_t offset = 0;
  void* host = nullptr;
};

struct StreamConfig {
  uint32_t queue_family = 0;
  uint32_t staging_memory_type = 0;
  uint32_t ops_per_batch = 256;          // submit after this many recorded ops (outside sequences)
  size_t staging_chunk = 16u << 20;      // staging is carved from chunks of this size (reused across batches)
  size_t staging_per_batch = 64u << 20;  // a batch holding more staging than this is submitted first
};

class CommandStream {
 public:
  CommandStream(VkDevice device, VkQueue queue, StreamConfig cfg);
  ~CommandStream();
  CommandStream(const CommandStream&) = delete;
  CommandStream& operator=(const CommandStream&) = delete;

  // The command buffer being recorded (a batch is begun on demand).
  VkCommandBuffer cmd();
  // A descriptor set for `layout` from the current batch's pools (freed when the batch is reused).
  VkDescriptorSet allocate_set(VkDescriptorSetLayout layout);
  // `bytes` of staging memory; may submit the current batch first to bound staging per batch.
  StagingSlice staging(size_t bytes);

  // Declares the ranges the next command reads and writes; records a barrier first if it depends on (or
  // overwrites what is used by) a command recorded since the last barrier.
  void hazard(const std::vector<Range>& reads, const std::vector<Range>& writes);
  void barrier();  // compute/transfer writes -> compute/transfer reads and writes
  // One op was recorded: submits at the batch limit unless a sequence is open.
  void end_op();

  void begin_sequence() { in_sequence_ = true; }
  void end_sequence();
  void submit();  // submits the current batch without waiting
  // Submits and waits for everything; with `host_read`, transfer writes are made visible to the host first.
  void finish(bool host_read = false);
  uint64_t submissions() const { return submissions_; }
  VkDevice device() const { return device_; }

 private:
  struct Batch;
  Batch& current();
  void wait(Batch& b);
  void recycle(Batch& b);

  VkDevice device_;
  VkQueue queue_;
  StreamConfig cfg_;
  CommandPool pool_;
  DescriptorPool make_descriptor_pool();
  std::vector<std::unique_ptr<Batch>> batches_;
  Batch* recording_ = nullptr;
  size_t next_ = 0;
  bool in_sequence_ = false;
  uint64_t submissions_ = 0;
  std::vector<Range> reads_, writes_;  // since the last barrier of the recording batch
  std::vector<std::unique_ptr<MappedBuffer>> free_chunks_;
};

}  // namespace kiln::vulkan
