// From a call's op kind to the kernel this backend runs for it, and what it supports on a given device: the
// registry's VulkanKernel for the kind (kernels/vulkan), else a plugin's ShaderKernel, else the reason why not.
#pragma once
#include <cstddef>
#include <vector>

#include "encoder.hpp"
#include "kiln/device.hpp"
#include "vulkan_kernel.hpp"

namespace kiln::vulkan {

class OpKernels {
 public:
  // Looks up the VulkanKernel of every op registered now (the plugin registered them when it loaded, before any
  // device opens): run() is called for every op of every step, and a registry lookup takes a lock and a map search.
  OpKernels();
  // Whether the op runs with these attributes on a device with these limits, and why not.
  Support supports(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits) const;
  // Scratch the call would like (the convolutions' split-K partial sums and patch matrices); calls run without it.
  size_t workspace_bytes(const OpCall& call, const DeviceLimits& limits) const;
  // Records `call` (already checked against op_arity and supports()); throws DeviceError when no kernel runs it.
  void run(Encoder& e, const OpCall& call) const;

 private:
  const VulkanKernel* find(OpKind kind) const {
    const auto i = static_cast<size_t>(kind);
    return i < by_kind_.size() && by_kind_[i].run ? &by_kind_[i] : nullptr;
  }
  std::vector<VulkanKernel> by_kind_;  // indexed by OpKind; run == nullptr where the kind has none
};

}  // namespace kiln::vulkan
