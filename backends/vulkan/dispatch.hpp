// From a call's op kind to the kernel this backend runs for it, and what it supports on a given device: the
// registry's VulkanKernel for the kind (kernels/vulkan), else a plugin's ShaderKernel. Without either, Device says
// why not (device.hpp).
#pragma once
#include <cstddef>
#include <vector>

#include "encoder.hpp"
#include "kiln/device.hpp"
#include "kiln/kernel_registry.hpp"
#include "vulkan_kernel.hpp"

namespace kiln::vulkan {

class OpKernels {
 public:
  // Looks up the VulkanKernel of every op registered now (the plugin registered them when it loaded, before any
  // device opens): run() is called for every op of every step, and a registry lookup takes a lock and a map search.
  OpKernels();
  // Whether the op runs with these attributes on a device with these limits, and why not. Device::supports has
  // checked the op and its attributes and found `k`, its registered kernel (a VulkanKernel or a ShaderKernel).
  Support supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k,
                   const DeviceLimits& limits) const;
  // Whether run() has a kernel for `kind`: a VulkanKernel looked up when the device opened, or a plugin's
  // ShaderKernel registered since.
  bool has_kernel(OpKind kind) const;
  // Scratch the call would like (the convolutions' split-K partial sums and patch matrices); calls run without it.
  // A call with 16-bit buffers whose kernel reads float32 only needs their float32 copies before that.
  size_t workspace_bytes(const OpCall& call, const DeviceLimits& limits) const;
  // Records `call` (already checked against op_arity and supports(), and has_kernel(call.kind)); `arity` is
  // op_arity of the call (the element count of each buffer, for the conversions).
  void run(Encoder& e, const OpCall& call, const OpArity& arity) const;

 private:
  // Whether the call has 16-bit buffers that its kernel does not read itself (VulkanKernel::takes_types).
  bool converts(const OpCall& call, const DeviceLimits& limits) const;
  void run_float32(Encoder& e, const OpCall& call) const;
  const VulkanKernel* find(OpKind kind) const {
    const auto i = static_cast<size_t>(kind);
    return i < by_kind_.size() && by_kind_[i].run ? &by_kind_[i] : nullptr;
  }
  std::vector<VulkanKernel> by_kind_;  // indexed by OpKind; run == nullptr where the kind has none
};

}  // namespace kiln::vulkan
