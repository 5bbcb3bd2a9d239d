// The cpu backend's op dispatch: every op runs the kernel registered for it on "cpu" (kernels/cpu registers the
// core's ops as CpuKernel, plugins register HostKernel). Calls arrive checked (check_call, when the executor binds),
// so kernels take their buffers as they come.
#include <string>

#include "backend.hpp"
#include "cpu_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cpu {

std::vector<CpuKernelEntry>& cpu_kernel_list() {
  static std::vector<CpuKernelEntry> list;
  return list;
}

const CpuKernel* CpuDevice::kernel(OpKind kind) const {
  const size_t k = static_cast<size_t>(kind);
  if (k < kernels_.size()) return kernels_[k];
  // Ops registered after this device opened (a plugin's, in tests) are looked up on every call.
  return find_kernel<CpuKernel>("cpu", kind);
}

bool CpuDevice::runs_kernel(const Kernel& k) const { return k.get<CpuKernel>() || k.get<HostKernel>(); }

// Device::supports found the op's kernel; a plugin's HostKernel refuses nothing.
Support CpuDevice::do_supports(OpKind kind, const OpAttrs& attrs, const OpArity&, const Kernel& k) const {
  const CpuKernel* ck = k.get<CpuKernel>();
  return ck && ck->supports ? ck->supports(kind, attrs) : Support{};
}

size_t CpuDevice::workspace_bytes(const OpCall& call) const {
  const CpuKernel* k = kernel(call.kind);
  return k && k->workspace_bytes ? k->workspace_bytes(*this, call) : 0;
}

bool CpuDevice::do_run(const OpCall& call) {
  if (const CpuKernel* k = kernel(call.kind)) {
    k->run(*this, call);
    return true;
  }
  const HostKernel* host = find_kernel<HostKernel>("cpu", call.kind);
  if (!host) return false;
  host->run(call);
  return true;
}

}  // namespace kiln::cpu
