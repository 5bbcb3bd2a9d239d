// One CUDA device: raw blocks from cudaMalloc for the core allocator, pinned-staged copies, one non-blocking
// stream that every op, copy and collective is ordered on, and CUDA graph capture of training steps.
//
// Settings read from the environment when a device opens (BackendOptions has no CUDA fields):
//   KILN_CUDA_TF32=1                 TF32 tensor cores for GEMM and convolutions (default: exact FP32)
//   KILN_CUDA_WORKSPACE_LIMIT=SIZE   per-op workspace budget ("256MiB", "5%"; default min(256 MiB, total/16))
//   KILN_CUDA_GRAPHS=0               never capture steps as CUDA graphs
// Named extensions (Device::extension): "cuda.stream" (cudaStream_t), "cuda.device" (CudaDevice*),
// "cuda.ordinal" (int*), "cuda.workspace_limit" (size_t*, writable: lower it to the memory budget left before
// planning), "cuda.graph_report" and "cuda.<state>_report" for each op family's per-device state, e.g.
// "cuda.conv_report" (const char*, regenerated on each lookup).
//
// The ops themselves are the kernels the op families register (cuda_kernel.hpp, kernels/cuda); dispatch.cpp
// finds them.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_kernel.hpp"
#include "graph.hpp"
#include "handles.hpp"
#include "kiln/device.hpp"
#include "staging.hpp"

namespace kiln::cuda {

// Name, PCI bus id ("0000:3b:00.0", like the Vulkan backend), UUID, compute capability and memory of CUDA
// device `ordinal`. Uses NVML for free memory when present (no CUDA context), cudaMemGetInfo otherwise.
DeviceInfo describe_device(int ordinal);

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, DeviceInfo info);
  ~CudaDevice() override;

  const DeviceInfo& info() const override { return info_; }
  size_t query_free_memory() override;
  Block* allocate_block(size_t bytes) override;
  void free_block(Block* b) noexcept override;
  // bfloat16 from compute capability 8.0, float16 from 7.0 (dispatch.cpp).
  Support supports_dtype(DType t) const override;
  // With the float32 copies of 16-bit buffers for kernels that read float32 only (dispatch.cpp).
  size_t workspace_bytes(const OpCall& call) const override;
  void synchronize() override;  // the op stream and the upload stream
  void wait_upload(uint64_t ticket) override;
  void begin_sequence(uint64_t step_id) override;
  void end_sequence() override;
  void* extension(std::string_view name) override;

  // For collectives: locks the device and finishes pending graph work, so the holder may enqueue on stream().
  std::unique_lock<std::mutex> lock_for_external_work();
  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_.get(); }
  void activate() const;  // cudaSetDevice(ordinal): every entry point runs on the right device

  // What the op families' kernels use (cuda_kernel.hpp). Handles are bound to stream().
  cublasHandle_t cublas() const { return cublas_.get(); }
  cudnnHandle_t cudnn() const { return cudnn_.get(); }
  bool tf32() const { return tf32_; }  // KILN_CUDA_TF32=1
  int cc_major() const { return cc_major_; }
  size_t workspace_limit() const { return workspace_limit_; }  // the per-op workspace budget
  // The family state add_device_state returned `index` for; T is the type its maker made.
  template <class T>
  T& state(size_t index) const {
    return static_cast<T&>(*states_.at(index).second);
  }

 protected:
  // Copies, upload_async, supports and run arrive checked (Device, device.hpp).
  void do_copy_from_host(const void* src, const BufferView& dst) override;
  void do_copy_to_host(const BufferView& src, void* dst) override;
  void do_copy_on_device(const BufferView& src, const BufferView& dst) override;
  // Input prefetch: src -> pinned buffer on the calling thread, then cudaMemcpyAsync on a second (copy) stream that
  // first waits for the ops enqueued so far; wait_upload() makes the op stream wait for the copy's event (the host
  // does not wait).
  uint64_t do_upload_async(const void* src, const BufferView& dst) override;
  bool runs_kernel(const Kernel& k) const override;  // CudaKernel, a plugin's StreamKernel
  Support do_supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k) const override;
  bool do_run(const OpCall& call) override;

 private:
  // dispatch.cpp: enqueues the op's kernel, with the conversions of its 16-bit buffers where it needs them.
  void execute(const OpCall& call, const void* scalars);
  void execute_kernel(const Kernel* k, const OpCall& call, const void* scalars);
  void validate(const OpCall& call, const CudaKernel* k) const;

  int ordinal_;
  DeviceInfo info_;
  int cc_major_ = 0, cc_minor_ = 0;
  bool tf32_ = false, graphs_enabled_ = true;
  size_t workspace_limit_ = 0;
  StreamHandle stream_;
  CublasHandle cublas_;
  CudnnHandle cudnn_;
  // One per add_device_state, in its order, with its name (made after the handles, destroyed before them).
  std::vector<std::pair<std::string, std::unique_ptr<CudaDeviceState>>> states_;
  std::unique_ptr<PinnedStaging> staging_;
  StreamHandle upload_stream_;  // created on first upload_async
  std::unique_ptr<PinnedStaging> upload_staging_;
  EventHandle ops_mark_;                                  // recorded on the op stream before each upload
  std::deque<std::pair<uint64_t, EventHandle>> uploads_;  // tickets not yet waited on, with their events
  std::vector<EventHandle> spare_events_;                 // waited-on events, reused (no create per step)
  uint64_t next_ticket_ = 1;
  std::unique_ptr<GraphRecorder> graphs_;
  std::mutex mu_;
  uint64_t next_block_id_ = 1;
  std::string report_;  // backing store of the *_report extensions
};

}  // namespace kiln::cuda
