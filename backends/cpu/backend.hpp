// The "cpu" backend: N logical devices sharing the host's memory and cores.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/device.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

struct CpuKernel;

// Host facts read from /proc (model name, MemTotal, MemAvailable).
struct HostInfo {
  std::string cpu_model;
  size_t total_memory = 0;
  size_t available_memory = 0;
};
HostInfo read_host_info();
size_t read_available_memory();

// One logical CPU device. Blocks come from posix_memalign; the stream is the calling thread (run() returns
// when the op is done), helped by the device's own worker threads. It fuses some runs of calls (fusion.cpp).
class CpuDevice final : public Device, public FusedRunner {
 public:
  // winograd: [device] winograd (3x3 stride-1 convolutions through oneDNN's Winograd kernels where they suit).
  CpuDevice(DeviceInfo info, int threads, bool winograd);
  ~CpuDevice() override;

  const DeviceInfo& info() const override { return info_; }
  size_t query_free_memory() override;
  Block* allocate_block(size_t bytes) override;
  void free_block(Block* b) noexcept override;
  size_t workspace_bytes(const OpCall& call) const override;
  Support supports_dtype(DType t) const override;  // dispatch.cpp
  // Waits for uploads still in flight on the transfer thread (ops run synchronously on the caller).
  void synchronize() override;
  void wait_upload(uint64_t ticket) override;
  void* extension(std::string_view name) override;           // kRunFused: this device
  size_t run_fused(std::span<const OpCall> calls) override;  // fusion.cpp

  int threads() const { return threads_; }
  // What kernels (kernels/cpu) run on: this device's pool, its per-thread loss sums, its [device] winograd setting,
  // and `n` part pointers for concat/split (grown once per shape, reused across calls).
  ThreadPool& pool() { return pool_; }
  double* partials() { return partials_.data(); }
  bool winograd() const { return winograd_; }
  std::vector<float*>& part_ptrs(size_t n) {
    if (part_ptrs_.size() < n) part_ptrs_.resize(n);
    return part_ptrs_;
  }

 protected:
  // Copies, upload_async, supports and run arrive checked (Device, device.hpp).
  void do_copy_from_host(const void* src, const BufferView& dst) override;
  void do_copy_to_host(const BufferView& src, void* dst) override;
  void do_copy_on_device(const BufferView& src, const BufferView& dst) override;
  // The copy runs on this device's transfer thread (started on first use), overlapping the ops of the step
  // the caller runs meanwhile: the final copy of a prefetched batch never sits on the step's path.
  uint64_t do_upload_async(const void* src, const BufferView& dst) override;
  bool runs_kernel(const Kernel& k) const override;  // CpuKernel, a plugin's HostKernel
  Support do_supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k) const override;
  bool do_run(const OpCall& call) override;

 private:
  // The kernel of a built-in op (or a core op registered without a built-in kind) looked up once per device; null
  // for plugins' ops, which run their HostKernel (dispatch.cpp).
  const CpuKernel* kernel(OpKind kind) const;
  std::vector<const CpuKernel*> kernels_;
  DeviceInfo info_;
  int threads_;
  bool winograd_;
  ThreadPool pool_;  // threads_ threads, this device's caller included
  std::atomic<uint64_t> next_block_id_{1};
  std::atomic<size_t> live_blocks_{0};
  std::vector<double> partials_;   // per-thread loss sums (deterministic reduction order)
  std::vector<float*> part_ptrs_;  // concat/split part pointers, reused across calls
  std::vector<float> plane_sums_;  // fusion.cpp: per-plane bias sums of a fused max-pool backward (n * c floats)

  // Upload queue served by one transfer thread; tickets complete in order.
  struct Upload {
    const void* src;
    void* dst;
    size_t bytes;
  };
  std::mutex tmu_;
  std::condition_variable tcv_;
  std::deque<Upload> uploads_;
  uint64_t issued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread transfer_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts);
  std::string name() const override { return "cpu"; }
  int priority() const override { return 100; }
  std::vector<DeviceInfo> enumerate() override;
  std::unique_ptr<Device> open(int index) override;

 private:
  int devices_;
  int threads_;
  bool winograd_;
};

}  // namespace kiln::cpu
