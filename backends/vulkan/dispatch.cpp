// From a call's op kind to its kernel, and the checks every op on this backend shares: maxStorageBufferRange, and
// for a plugin's ShaderKernel its binding limit (Device::supports checked the op, its arity and that it has a
// kernel). What a kernel refuses beyond that is its own supports().
#include "dispatch.hpp"

#include <array>
#include <string>

#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::vulkan {
namespace {

Support no(std::string why) { return {false, std::move(why)}; }

// A plugin's op: its shader binds the inputs, then the outputs.
void run_shader(Encoder& e, const OpCall& c) {
  const ShaderKernel* k = find_kernel<ShaderKernel>("vulkan", c.kind);
  // has_kernel found it before the call was recorded; only a plugin re-registering it as another kind gets here.
  if (!k)
    throw DeviceError("vulkan: the kernel of op " + std::string(op_name(c.kind)) +
                      " was replaced by one of a kind this backend does not run");
  std::vector<Bind> binds;
  for (const auto& v : c.in) binds.push_back(rd(v));
  for (const auto& v : c.out) binds.push_back(wr(v));
  const std::array<uint32_t, 3> g = k->groups ? k->groups(c) : std::array<uint32_t, 3>{1, 1, 1};
  e.dispatch_shader(*k, binds, k->params ? k->params(c) : std::vector<uint32_t>{}, g[0], g[1], g[2]);
}

}  // namespace

OpKernels::OpKernels() {
  by_kind_.resize(op_count());
  for (size_t i = 0; i < by_kind_.size(); ++i)
    if (const VulkanKernel* k = find_kernel<VulkanKernel>("vulkan", static_cast<OpKind>(i))) by_kind_[i] = *k;
}

bool OpKernels::has_kernel(OpKind kind) const { return find(kind) || find_kernel<ShaderKernel>("vulkan", kind); }

Support OpKernels::supports(OpKind kind, const OpAttrs& attrs, const OpArity& ar, const Kernel& k,
                            const DeviceLimits& limits) const {
  const VulkanKernel* kernel = k.get<VulkanKernel>();
  auto check = [&](const std::vector<int64_t>& sizes, const char* what) -> Support {
    for (size_t i = 0; i < sizes.size(); ++i)
      if (static_cast<uint64_t>(sizes[i]) * sizeof(float) > limits.max_range)
        return no(std::string(what) + "[" + std::to_string(i) + "] holds " + std::to_string(sizes[i] * 4) +
                  " bytes, above this device's maxStorageBufferRange of " + std::to_string(limits.max_range));
    return {};
  };
  if (!kernel || !kernel->transfer) {
    if (Support s = check(ar.in, "input"); !s.yes) return s;
    if (Support s = check(ar.out, "output"); !s.yes) return s;
  }
  if (!kernel) {  // a plugin's ShaderKernel
    if (ar.in.size() + ar.out.size() > 8) return no("a plugin's kernel binds at most 8 buffers");
    return {};
  }
  return kernel->supports ? kernel->supports(kind, attrs, limits) : Support{};
}

size_t OpKernels::workspace_bytes(const OpCall& call, const DeviceLimits& limits) const {
  const VulkanKernel* kernel = find(call.kind);
  return kernel && kernel->workspace_bytes ? kernel->workspace_bytes(call, limits) : 0;
}

void OpKernels::run(Encoder& e, const OpCall& call) const {
  if (const VulkanKernel* kernel = find(call.kind)) return kernel->run(e, call);
  run_shader(e, call);
}

}  // namespace kiln::vulkan
