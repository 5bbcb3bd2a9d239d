// The op dispatch of CudaDevice: which registered kernel answers supports(), workspace_bytes() and run() for a
// call, and the registrars the op families in kernels/cuda use (cuda_kernel.hpp). No op is named here: a
// built-in op's CUDA kernel is a CudaKernel its family registered, a plugin's op a StreamKernel.
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_device.hpp"
#include "cuda_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda {
namespace {

const std::string& backend_name() {
  static const std::string name = "cuda";
  return name;
}

struct Family {
  const char* name;
  void (*register_fn)();
};
std::vector<Family>& families() {
  static std::vector<Family> f;
  return f;
}

std::vector<DeviceStateMaker>& state_makers() {
  static std::vector<DeviceStateMaker> m;
  return m;
}

}  // namespace

bool list_kernel_family(const char* family, void (*register_fn)()) {
  families().push_back({family, register_fn});
  return true;
}

void register_builtin_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const Family& f : families()) {
      try {
        f.register_fn();
      } catch (const Error& e) {
        throw Error(std::string("cuda kernels of family '") + f.name + "': " + e.what());
      }
    }
  });
}

void register_cuda_kernel(OpKind op, CudaKernel k) {
  const OpDesc& d = op_desc(op);
  if (!k.run) throw Error("cuda kernel of op '" + d.name + "' has no run function");
  if (d.step_scalars != kStepNone && !k.pack_step_scalars)
    throw Error("cuda kernel of op '" + d.name +
                "' reads per-step scalars but has no pack_step_scalars (a CUDA graph would replay stale values)");
  if (k.workspace_required && !k.workspace)
    throw Error("cuda kernel of op '" + d.name + "' requires a workspace but does not size it");
  register_kernel(backend_name(), op, std::move(k));
}

const CudaKernel* find_cuda_kernel(OpKind op) { return find_kernel<CudaKernel>(backend_name(), op); }

size_t add_device_state(const char* name, MakeDeviceState make) {
  state_makers().push_back({name, make});
  return state_makers().size() - 1;
}

const std::vector<DeviceStateMaker>& device_state_makers() { return state_makers(); }

bool pack_step_scalars(const OpCall& call, void* slot) {
  if (!op_known(call.kind) || op_desc(call.kind).step_scalars == kStepNone) return false;
  // A plugin's StreamKernel has no slot: it reads its attributes as recorded (architecture.md: not supported
  // inside a graph). A CudaKernel of such an op has pack_step_scalars (register_cuda_kernel checks).
  const CudaKernel* k = find_cuda_kernel(call.kind);
  if (!k) return false;
  std::memset(slot, 0, kStepScalarSlotBytes);
  k->pack_step_scalars(call, slot);
  return true;
}

Support CudaDevice::supports(OpKind kind, const OpAttrs& attrs) const {
  if (!op_known(kind)) return {false, "unknown op kind " + std::to_string(static_cast<int>(kind))};
  if (static_cast<size_t>(kind) < kBuiltinOpCount) {
    OpArity ar;
    try {
      ar = op_arity(kind, attrs);  // checks the attribute type
    } catch (const Error& e) {
      return {false, e.what()};
    }
    for (const auto* list : {&ar.in, &ar.out})
      for (int64_t n : *list)
        if (n < 0) return {false, std::string(op_name(kind)) + ": negative buffer size " + std::to_string(n)};
  }
  const Kernel* k = find_kernel(backend_name(), kind);
  if (const CudaKernel* ck = k ? k->get<CudaKernel>() : nullptr)
    return ck->support ? ck->support(kind, attrs) : Support{};
  if (k && k->get<StreamKernel>()) return {};
  return {false, missing_kernel_reason(backend_name(), kind)};
}

size_t CudaDevice::workspace_bytes(const OpCall& call) const {
  const CudaKernel* k = find_cuda_kernel(call.kind);
  return k && k->workspace ? k->workspace(*this, call) : 0;
}

// Buffer counts and sizes were checked when the call was bound (check_call); what remains is CUDA's own.
void CudaDevice::validate(const OpCall& call) const {
  const std::string op = info_.label() + " op " + std::string(op_name(call.kind));
  // cuBLAS refuses a workspace below 256-byte alignment; the core allocator aligns every allocation to 256.
  if (call.workspace.block && call.workspace.bytes > 0 &&
      reinterpret_cast<uintptr_t>(static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset) % 256 != 0)
    throw DeviceError(op + ": the workspace must start at a 256-byte aligned address, found offset " +
                      std::to_string(call.workspace.offset) + " in its block");
  const CudaKernel* k = find_cuda_kernel(call.kind);
  if (k && k->workspace_required) {
    const size_t need = k->workspace(*this, call);
    if (!call.workspace.block || call.workspace.bytes < need)
      throw DeviceError(op + ": needs a workspace of " + std::to_string(need) + " bytes, was given " +
                        std::to_string(call.workspace.bytes) + " (ask Device::workspace_bytes)");
  }
}

void CudaDevice::execute(const OpCall& c, const void* scalars) {
  const Kernel* k = find_kernel(backend_name(), c.kind);
  if (const CudaKernel* ck = k ? k->get<CudaKernel>() : nullptr)
    return ck->run(CudaOp{*this, c, stream_.get(), scalars});
  if (const StreamKernel* sk = k ? k->get<StreamKernel>() : nullptr) return sk->run(c, stream_.get());
  throw DeviceError(info_.label() + ": " + missing_kernel_reason(backend_name(), c.kind));
}

}  // namespace kiln::cuda
