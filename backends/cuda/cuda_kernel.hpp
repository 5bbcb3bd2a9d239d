// The CUDA backend's own kind of kernel (kiln/kernel_registry.hpp), the one its built-in ops register for "cuda".
// A plugin's StreamKernel sees only the call and a stream; a CudaKernel also sees the device (cuBLAS and cuDNN
// handles, workspace budget, per-device state) and the slot that holds its per-step scalars inside a CUDA graph.
//
// Each op family keeps its kernels and their registration in one file, kernels/cuda/<family>.cu:
//   KILN_CUDA_KERNELS(layer_norm) {
//     register_cuda_kernel(OpKind::LayerNormForward, {.run = [](const CudaOp& op) { ... }});
//   }
// The bodies run when the runtime library is initialized (register_builtin_kernels, called by the plugin right
// after it loads the library), not while it loads: a library opened only to be closed again registers nothing
// whose code would then be unloaded, and an error reaches the plugin as an exception instead of ending the process.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/ops.hpp"

namespace kiln::cuda {

class CudaDevice;

// The device buffer of one op's per-step scalars (learning rate, Adam's bias corrections, dropout counter) that
// a captured CUDA graph's kernels read, rewritten before every replay.
inline constexpr size_t kStepScalarSlotBytes = 64;

// One call being enqueued on the device's op stream.
struct CudaOp {
  CudaDevice& device;
  const OpCall& call;
  cudaStream_t stream;
  // Inside a CUDA graph, the device address of the scalars pack_step_scalars wrote for this call; the kernel
  // reads them there instead of from the attributes (which the graph would replay as recorded). Null otherwise.
  const void* step_scalars;

  // Buffer addresses (null for an unbound buffer). in()/out() are for float32 buffers: a kernel without
  // takes_types only ever sees those (dispatch.cpp converts 16-bit ones); raw_in()/raw_out() for typed kernels.
  const void* raw_in(size_t i) const {
    const BufferView& v = call.in[i];
    return v.block ? static_cast<const char*>(v.block->ptr) + v.offset : nullptr;
  }
  void* raw_out(size_t i) const {
    const BufferView& v = call.out[i];
    return v.block ? static_cast<char*>(v.block->ptr) + v.offset : nullptr;
  }
  const float* in(size_t i) const {
    const BufferView& v = call.in[i];
    return v.block ? reinterpret_cast<const float*>(static_cast<const char*>(v.block->ptr) + v.offset) : nullptr;
  }
  float* out(size_t i) const {
    const BufferView& v = call.out[i];
    return v.block ? reinterpret_cast<float*>(static_cast<char*>(v.block->ptr) + v.offset) : nullptr;
  }
  void* workspace() const {
    return call.workspace.block ? static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset : nullptr;
  }
  template <class A>
  const A& attrs() const {
    return std::get<A>(call.attrs);
  }
};

struct CudaKernel {
  // Enqueues the op on op.stream; throws DeviceError when a launch or library call fails.
  void (*run)(const CudaOp& op) = nullptr;
  // Refuses attributes this kernel cannot run, with the reason (after the op's arity accepted them). Null: any.
  Support (*support)(OpKind kind, const OpAttrs& attrs) = nullptr;
  // The workspace a call asks for (Device::workspace_bytes). Null: none.
  size_t (*workspace)(const CudaDevice& device, const OpCall& call) = nullptr;
  // run() cannot do without the whole workspace (the device refuses a smaller one before enqueuing); false when
  // any size, even none, works (cuBLAS picks algorithms that fit).
  bool workspace_required = false;
  // Writes what run() reads through step_scalars into `slot` (kStepScalarSlotBytes, zeroed). Required exactly
  // when the op's descriptor lists step scalars (register_cuda_kernel checks), so a graph never replays a stale
  // learning rate.
  void (*pack_step_scalars)(const OpCall& call, void* slot) = nullptr;
  // run() reads and writes the call's buffer types as they are (16-bit storage included). Null, or false for a
  // call: the device converts the call's 16-bit buffers to float32 scratch in the workspace before run() and back
  // after it (dispatch.cpp), so run() sees float32 only, and `workspace` is asked about that float32 call.
  bool (*takes_types)(const OpCall& call) = nullptr;
};

// Converts n values of storage type `from` at `src` to `to` at `dst` on stream `s` (kernels/cuda/cast.cu), rounding
// to nearest even, NaN kept; from == to copies. src and dst do not overlap. Throws DeviceError when the launch fails.
void cast_values(cudaStream_t s, const void* src, DType from, void* dst, DType to, int64_t n);

// Registers `k` for "cuda" through the core's kernel registry (kiln::register_kernel, what Registry::add_kernel
// calls for plugins). Throws Error for a kernel without run, or without pack_step_scalars for an op with
// per-step scalars.
void register_cuda_kernel(OpKind op, CudaKernel k);

// The CudaKernel registered for `op`, or null (a plugin's StreamKernel, or nothing).
const CudaKernel* find_cuda_kernel(OpKind op);

// Copies a kernel's scalar block into its slot.
template <class P>
void put_step_scalars(const P& p, void* slot) {
  static_assert(std::is_trivially_copyable_v<P> && sizeof(P) <= kStepScalarSlotBytes);
  std::memcpy(slot, &p, sizeof p);
}

// Lists a family's registration function while the runtime library loads; register_builtin_kernels runs it.
bool list_kernel_family(const char* family, void (*register_fn)());
// Runs every listed family's registration once. Throws what a registration throws.
void register_builtin_kernels();

// Per-device state of an op family (the convolutions' cuDNN plans): every device makes one of each when it
// opens, after its handles, and destroys it before them. report() is what the device's extension
// "cuda.<name>_report" returns.
class CudaDeviceState {
 public:
  virtual ~CudaDeviceState() = default;
  virtual std::string report() const { return {}; }
};
using MakeDeviceState = std::unique_ptr<CudaDeviceState> (*)(CudaDevice& device);
// Adds a state every device makes (call it while the library loads, from a namespace-scope initializer); the
// index it returns is the argument of CudaDevice::state<T>().
size_t add_device_state(const char* name, MakeDeviceState make);
struct DeviceStateMaker {
  const char* name;
  MakeDeviceState make;
};
const std::vector<DeviceStateMaker>& device_state_makers();

}  // namespace kiln::cuda

// At namespace scope in kernels/cuda/<family>.cu, followed by the body that registers the family's kernels.
#define KILN_CUDA_KERNELS(family)                                             \
  static void kiln_cuda_kernels_##family();                                   \
  [[maybe_unused]] static const bool kiln_cuda_kernels_##family##_listed =    \
      ::kiln::cuda::list_kernel_family(#family, &kiln_cuda_kernels_##family); \
  static void kiln_cuda_kernels_##family()
