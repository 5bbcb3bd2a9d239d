// Backends and devices: what a compute plugin implements.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/ops.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// One raw allocation made by a device. `ptr` is host-addressable memory for the CPU backend and a device
// address for CUDA; `native` is a backend handle (a VkBuffer for Vulkan). Owned by the device that made it.
struct Block {
  void* ptr = nullptr;
  void* native = nullptr;
  size_t bytes = 0;
  uint64_t id = 0;
};

// A byte range inside a block.
struct BufferView {
  const Block* block = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
  // What the bytes hold: float32, or 16-bit storage (bf16, f16) under a 16-bit precision policy. A kernel that
  // does not say it reads 16-bit storage (CpuKernel::typed and its kin) sees float32 only: its backend converts.
  DType dtype = DType::f32;

  // Host pointer for backends whose blocks are host-addressable (CPU).
  float* host() const { return reinterpret_cast<float*>(static_cast<char*>(block->ptr) + offset); }
  void* raw() const { return static_cast<char*>(block->ptr) + offset; }
  bool overlaps(const BufferView& o) const {
    return block == o.block && offset < o.offset + o.bytes && o.offset < offset + bytes;
  }
};

// One op bound to buffers, ready to run. `workspace` is scratch of at least Device::workspace_bytes(call).
struct OpCall {
  OpKind kind{};
  OpAttrs attrs;
  std::vector<BufferView> in;
  std::vector<BufferView> out;
  BufferView workspace;
};

struct Support {
  bool yes = true;
  std::string reason;  // why not, when !yes
};

// What kind of processor a device is. A GPU API implemented on the CPU (Mesa's lavapipe) reports `cpu`.
enum class DeviceType { cpu, gpu, integrated_gpu, virtual_gpu, other };
std::string_view device_type_name(DeviceType t);  // "cpu", "gpu", "integrated_gpu", "virtual_gpu", "other"

// A device as its backend describes it. Kiln decides by these fields, never by a backend's or a driver's name.
struct DeviceInfo {
  std::string backend;  // the backend's name: "cpu", "vulkan", "cuda", a plugin's
  int index = 0;        // index within its backend
  std::string name;     // "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.7, 256 bits)"
  DeviceType type = DeviceType::other;
  // Block::ptr of this device's blocks is host memory the host may read and write directly, also while the
  // device's ops run on other blocks (the CPU backend). False: only copy_to_host/copy_from_host reach the data.
  bool host_addressable = false;
  std::string hardware_id;             // PCI bus id or UUID; stable across backends for the same hardware
  size_t total_memory = 0;             // bytes, as the driver reports
  size_t free_memory = 0;              // bytes, as the driver reports (other processes included)
  std::vector<std::string> processes;  // processes using the device, where the driver tells

  std::string label() const { return backend + ":" + std::to_string(index); }
};

class Kernel;  // kernel_registry.hpp

// A device: raw memory, copies, a stream of ops. Ops and copies are enqueued in order on the device's one
// stream; synchronize() waits for all of them. Memory is managed by the core Allocator on top of
// allocate_block/free_block; devices never pool memory themselves.
//
// Checked once, for every backend: the copies, upload_async, supports and run are not virtual. Each checks its
// arguments against the contract written next to it (core/src/sdk/device_checks.cpp), throws DeviceError starting
// with the device's label and the function's name when they break it, and only then calls the backend's protected
// do_* function, which may take the contract as given. What only one device can tell stays in its do_* (the Vulkan
// backend: is this block my memory).
class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual const DeviceInfo& info() const = 0;
  // Free memory now, as the driver reports (refreshes info().free_memory's notion).
  virtual size_t query_free_memory() { return info().free_memory; }

  // A new raw block of exactly `bytes`, or nullptr when the device has no memory for it (never throws for OOM).
  virtual Block* allocate_block(size_t bytes) = 0;
  virtual void free_block(Block* b) noexcept = 0;

  // The copies' contract, the same on every backend:
  // - a view of n > 0 bytes has a block and lies inside it (offset + n <= block->bytes); a host pointer for n > 0
  //   bytes is not null. A copy of 0 bytes does nothing (its views need no block, its pointer may be null).
  // - copy_on_device copies exactly src.bytes into a destination of exactly as many bytes: sizes must be equal, a
  //   larger destination is refused as a smaller one is (like torch's copy_, nothing is truncated or padded, so a
  //   size mismatch is always a caller's bug, never a silent partial write).
  // - copy_on_device of a view onto itself (same block, offset and size) does nothing. Views that overlap
  //   otherwise are refused: as in torch ("some elements of the input tensor and the written-to tensor refer to a
  //   single memory location"), and because the GPU copy commands leave it undefined (vkCmdCopyBuffer forbids
  //   overlapping regions, cudaMemcpyAsync does not promise memmove), so allowing it would cost those backends a
  //   staging copy to support a call that Kiln never makes.
  void copy_from_host(const void* src, const BufferView& dst);
  void copy_to_host(const BufferView& src, void* dst);  // waits until the bytes are on the host
  void copy_on_device(const BufferView& src, const BufferView& dst);

  // Whether this device runs `kind` with `attrs`, and why not. Checked here for every backend, in this order: the
  // op is known (op_known), the attributes fit the op (op_arity does not throw and gives no negative size), and the
  // kernel registry holds a kernel for the op on this device's backend (info().backend) of a kind the device runs
  // (runs_kernel); the reason is then missing_kernel_reason's. Only then does do_supports say what the kernel
  // refuses for these attributes on this device.
  Support supports(OpKind kind, const OpAttrs& attrs) const;
  // Whether every op runs with buffers holding `t` ([precision] compute; float32 always). The executor refuses a
  // graph with 16-bit tensors on a device that says no, with this reason, before anything runs. A yes with a reason is
  // a notice `kiln train` prints (e.g. a type that works but slowly). Default: float32 only.
  virtual Support supports_dtype(DType t) const;
  // Scratch bytes the op needs; the executor hands a workspace at least this big.
  virtual size_t workspace_bytes(const OpCall&) const { return 0; }
  // Runs a call that check_call accepted (the executor checks each call once, when it binds it; this runs for every
  // op of every step and checks nothing again). A device without a kernel for the call's op throws the DeviceError
  // that supports() gives as the reason.
  void run(const OpCall& call);
  virtual void synchronize() = 0;

  // Input prefetch: the trainer copies the next batch into a second input buffer while the current step runs.
  // upload_async() starts copying `bytes` of host memory at `src` into `dst` and returns a ticket without waiting
  // for the copy (a backend with a separate transfer path: CUDA's copy stream through pinned buffers, the CPU
  // backend's transfer thread). `src` must stay valid until wait_upload(ticket) returns. wait_upload() orders the
  // copy before every op and copy enqueued after it; it may block the host (CPU) or only the device's stream (CUDA).
  // A copy may overwrite `dst` while ops enqueued before upload_async() still run only if the backend orders it
  // after them (CUDA waits on an event of the op stream); the caller never uploads into a buffer that ops enqueued
  // later than that still read. Every ticket is waited on exactly once. `dst` and `src` are checked as for
  // copy_from_host; a copy of 0 bytes still returns a ticket to wait on.
  uint64_t upload_async(const void* src, const BufferView& dst);
  virtual void wait_upload(uint64_t /*ticket*/) {}

  // Optional hooks around a training step, so a backend can record and replay it (Vulkan command buffers,
  // CUDA graphs). `step_id` identifies the op sequence: equal ids mean the same calls with the same buffers.
  virtual void begin_sequence(uint64_t /*step_id*/) {}
  virtual void end_sequence() {}

  // Optional, backend-specific features looked up by name (e.g. "cuda.stream"); nullptr when absent.
  virtual void* extension(std::string_view /*name*/) { return nullptr; }

 protected:
  // What a backend implements, called only after the public function's checks passed (and never for a copy of 0
  // bytes, nor for copy_on_device of a view onto itself).
  virtual void do_copy_from_host(const void* src, const BufferView& dst) = 0;
  virtual void do_copy_to_host(const BufferView& src, void* dst) = 0;
  virtual void do_copy_on_device(const BufferView& src, const BufferView& dst) = 0;
  // Default: a synchronous copy, ticket 0 (wait_upload's default accepts it). Called for 0 bytes too.
  virtual uint64_t do_upload_async(const void* src, const BufferView& dst) {
    if (dst.bytes) do_copy_from_host(src, dst);
    return 0;
  }
  // Whether this device runs kernels of `k`'s kind (the CPU backend: CpuKernel and a plugin's HostKernel).
  virtual bool runs_kernel(const Kernel& k) const = 0;
  // What the op's kernel `k` (registered for this backend, of a kind runs_kernel accepts) refuses for these
  // attributes on this device; `arity` is op_arity(kind, attrs).
  virtual Support do_supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k) const = 0;
  // Enqueues the call and returns true, or returns false having done nothing when this device has no kernel for
  // call.kind (run() then throws the missing-kernel DeviceError).
  virtual bool do_run(const OpCall& call) = 0;
};

// The optional extension kRunFused: a device that fuses runs of consecutive calls into one kernel. The executor
// offers it the calls left in the range it runs; run_fused runs a prefix of two or more of them and returns how
// many, or returns 0 having run nothing. A fused run leaves every output buffer of those calls as running them
// one by one would (up to float rounding), so fusing changes neither the graph nor its memory plan.
inline constexpr std::string_view kRunFused = "kiln.run_fused";
class FusedRunner {
 public:
  virtual ~FusedRunner() = default;
  virtual size_t run_fused(std::span<const OpCall> calls) = 0;
};

// A device may answer extension(kValidationMessagesExtension) with a std::atomic<uint64_t>* counting driver
// validation warnings and errors (the Vulkan backend when its validation layer is on; nullptr otherwise); the
// conformance suite fails a backend whose count is not zero at the end of its run.
inline constexpr const char* kValidationMessagesExtension = "validation.message_count";

// What a backend is made with: the run's [device] table. Each backend reads its own keys from it (the CPU
// backend's virtual_devices and threads, Vulkan's validation) with ConfigNode's getters, and fails through
// ConfigNode::fail, so errors name the file, line and key; the session rejects keys no backend read.
struct BackendOptions {
  BackendOptions();  // an empty [device] table: every key at its default
  explicit BackendOptions(ConfigNode device_table) : device(std::move(device_table)) {}
  // The keys of a [device] table written as TOML, for tools and tests: BackendOptions::parse("threads = 1").
  static BackendOptions parse(const std::string& keys);

  ConfigNode device;
};

// A compute backend: enumerates and opens its devices. Making one must be cheap and touch no driver (the session
// makes every loaded backend so each reads its [device] keys); enumerate() and open() do the work.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;
  // Rank for [device] backend = "auto": backends are tried from the highest priority down, and the first with a
  // usable device is taken (a device of type cpu counts only when it is host-addressable: a GPU API emulated on
  // the CPU is slower than the CPU backend). Built in: cuda 300, vulkan 200, cpu 100. Below 0: never chosen.
  virtual int priority() const { return 0; }
  // Checks the configuration this backend runs with (its [device] keys are read when it is made; the environment,
  // e.g. CUDA_VISIBLE_DEVICES) when a run may use it, before any device opens. Throws ConfigError.
  virtual void check_config() const {}
  // Devices present. An empty list comes with unavailable_reason() saying why (no driver, no device).
  virtual std::vector<DeviceInfo> enumerate() = 0;
  virtual std::string unavailable_reason() const { return {}; }
  // Opens device `index` of enumerate(); throws DeviceError naming the index and the devices present.
  virtual std::unique_ptr<Device> open(int index) = 0;
};

}  // namespace kiln
