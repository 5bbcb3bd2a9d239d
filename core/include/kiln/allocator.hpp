// The one allocator every backend uses: a best-fit, coalescing arena over a device's raw blocks.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/error.hpp"

namespace kiln {

enum class MemoryTag : uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,
  workspace,
  input_data,
  other,
  Count_
};
inline constexpr size_t kMemoryTagCount = static_cast<size_t>(MemoryTag::Count_);
const char* memory_tag_name(MemoryTag t);

// "1200MiB", "1.5GB", "800000", "60%" -> bytes (a percentage is of `device_total`). Throws ConfigError.
size_t parse_memory_size(const std::string& text, size_t device_total);
std::string format_bytes(size_t bytes);  // "1.17 GiB"

// Whether the device's memory is the host's physical memory, shared with every other such device: the logical
// devices of the host CPU backend (type cpu, host addressable) all are.
bool shares_host_memory(const DeviceInfo& d);
// Limits of devices that share one physical memory must fit in it together (as one device's limit must fit the
// device's total). "" when they do, else why not: "gives the 2 devices that share the host's memory 14.12 GiB each:
// cpu:0 14.12 GiB + cpu:1 14.12 GiB = 28.24 GiB (120% of it), more than ..., at most 11.77 GiB (\"50%\") each".
std::string shared_memory_overcommit(const std::vector<std::pair<const DeviceInfo*, size_t>>& limits);

struct AllocatorOptions {
  size_t limit = 0;             // hard cap on bytes reserved from the device; 0 = device total
  bool growth = true;           // take blocks on demand; false reserves `limit` at start
  size_t min_block = 2u << 20;  // smallest block requested when growing
  size_t alignment = 256;       // of every allocation
  size_t max_block = 0;         // the device's largest single allocation (0 = no limit)
  size_t max_blocks = 0;        // the device's allocation count limit (0 = no limit)
  int fail_block_request = 0;   // fault injection: the k-th block request (1-based) fails; 0 = off
};

struct MemoryStats {
  size_t reserved = 0;  // bytes taken from the device in blocks
  size_t in_use = 0;    // bytes handed out
  size_t peak_in_use = 0;
  size_t peak_reserved = 0;
  size_t largest_free = 0;  // the largest free range inside reserved blocks
  size_t blocks = 0;
  size_t block_requests = 0;
  std::array<size_t, kMemoryTagCount> in_use_by_tag{};
  std::array<size_t, kMemoryTagCount> peak_by_tag{};
  // 1 - largest_free / total free inside reserved blocks (0 when nothing is free).
  double fragmentation() const;
};

// What an allocation was for, used in reports.
struct AllocationSite {
  MemoryTag tag = MemoryTag::other;
  std::string what;  // "layer conv2d_3 weights", "op gemm workspace"
};

class Allocator;

// A live allocation; frees itself on destruction (RAII, move-only).
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation() { reset(); }

  void reset() noexcept;
  const BufferView& view() const { return view_; }
  size_t bytes() const { return view_.bytes; }
  explicit operator bool() const { return owner_ != nullptr; }

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  BufferView view_;
  size_t padded_ = 0;
  MemoryTag tag_ = MemoryTag::other;
};

// Thrown when an allocation does not fit the limit or the device. The message is the full report.
class OutOfMemory : public Error {
 public:
  OutOfMemory(std::string msg, size_t requested, MemoryStats stats)
      : Error(std::move(msg)), requested_(requested), stats_(stats) {}
  size_t requested() const { return requested_; }
  const MemoryStats& stats() const { return stats_; }

 private:
  size_t requested_;
  MemoryStats stats_;
};

// Best-fit with splitting and coalescing over device blocks. Not thread-safe (one per device, used by the
// executor's thread).
class Allocator {
 public:
  Allocator(Device& device, AllocatorOptions opts);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Throws OutOfMemory with a report naming the site, the limit, usage by tag and the device's free memory.
  Allocation allocate(size_t bytes, const AllocationSite& site);
  const MemoryStats& stats() const { return stats_; }
  const AllocatorOptions& options() const { return opts_; }
  Device& device() { return device_; }
  size_t limit() const { return opts_.limit; }
  // Returns blocks that are entirely free to the device (growth mode only).
  void release_free_blocks();
  // Growth mode: gives entirely free blocks back and takes one block of `bytes` (within the limit) unless a free
  // range that large exists, so a planned set of allocations packs into it without block-boundary waste.
  // Returns false (and changes nothing else) when the limit or the device does not allow it.
  bool reserve(size_t bytes);
  // A human-readable table of the stats (used in OOM reports and `kiln train` summaries).
  std::string report() const;
  // Extra advice appended to OOM reports (the trainer sets "largest batch that fits: ..." here).
  void set_oom_hint(std::string hint) { oom_hint_ = std::move(hint); }
  // Advice computed only when an OOM report is written (e.g. re-planning for a smaller batch); its exceptions
  // are swallowed. Appended after the fixed hint.
  void set_oom_hint_provider(std::function<std::string()> provider) { oom_hint_provider_ = std::move(provider); }
  // Starts a new measurement window: peaks restart from the current usage.
  void reset_peak();

 private:
  friend class Allocation;
  struct Range {
    Block* block;
    size_t offset, bytes;
    bool free;
  };
  void free_range(const BufferView& v, size_t padded, MemoryTag tag) noexcept;
  bool grow(size_t at_least);
  void update_largest_free();
  [[noreturn]] void throw_oom(size_t bytes, const AllocationSite& site, const std::string& why);

  Device& device_;
  AllocatorOptions opts_;
  MemoryStats stats_;
  std::vector<Block*> blocks_;
  // Ranges of each block keyed by (block id, offset); free ranges also indexed by size for best fit.
  std::map<std::pair<uint64_t, size_t>, Range> ranges_;
  std::set<std::tuple<size_t, uint64_t, size_t>> free_by_size_;  // (bytes, block id, offset)
  std::map<uint64_t, Block*> block_by_id_;
  std::string oom_hint_;
  std::string grow_failure_;  // why the last grow() failed, for the OOM report
  bool fault_fired_ = false;  // the last grow() failed by fault injection
  std::function<std::string()> oom_hint_provider_;
};

}  // namespace kiln
