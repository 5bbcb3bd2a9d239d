// The op dispatch of CudaDevice: which registered kernel answers do_supports(), workspace_bytes() and do_run() for
// a call (Device::supports checks the op and finds its kernel first), and the registrars the op families in
// kernels/cuda use (cuda_kernel.hpp). No op is named here: a built-in op's CUDA kernel is a CudaKernel its family
// registered, a plugin's op a StreamKernel.
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

bool CudaDevice::runs_kernel(const Kernel& k) const { return k.get<CudaKernel>() || k.get<StreamKernel>(); }

// Device::supports checked the op, its attributes and found its kernel; a plugin's StreamKernel refuses nothing.
Support CudaDevice::do_supports(OpKind kind, const OpAttrs& attrs, const OpArity&, const Kernel& k) const {
  const CudaKernel* ck = k.get<CudaKernel>();
  return ck && ck->support ? ck->support(kind, attrs) : Support{};
}

size_t CudaDevice::workspace_bytes(const OpCall& call) const {
  const CudaKernel* k = find_cuda_kernel(call.kind);
  return k && k->workspace ? k->workspace(*this, call) : 0;
}

bool CudaDevice::do_run(const OpCall& call) {
  // Looked up here, before the call may be recorded into a graph: a call without a kernel enqueues nothing.
  const Kernel* k = find_kernel(backend_name(), call.kind);
  if (!k || !runs_kernel(*k)) return false;
  validate(call, k->get<CudaKernel>());
  std::lock_guard lock(mu_);
  activate();
  graphs_->run(call);
  return true;
}

// Buffer counts and sizes were checked when the call was bound (check_call); what remains is CUDA's own.
void CudaDevice::validate(const OpCall& call, const CudaKernel* k) const {
  const std::string op = info_.label() + " op " + std::string(op_name(call.kind));
  // cuBLAS refuses a workspace below 256-byte alignment; the core allocator aligns every allocation to 256.
  if (call.workspace.block && call.workspace.bytes > 0 &&
      reinterpret_cast<uintptr_t>(static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset) % 256 != 0)
    throw DeviceError(op + ": the workspace must start at a 256-byte aligned address, found offset " +
                      std::to_string(call.workspace.offset) + " in its block");
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
  // do_run found the kernel before enqueuing; only a plugin re-registering it as another kind gets here.
  throw DeviceError(info_.label() + ": the kernel of op " + std::string(op_name(c.kind)) +
                    " was replaced by one of a kind this backend does not run after the call was enqueued");
}

}  // namespace kiln::cuda
