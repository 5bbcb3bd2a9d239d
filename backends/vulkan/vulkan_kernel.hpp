// The vulkan backend's own kind of kernel: it records into the device's command stream through an Encoder. Each
// file of kernels/vulkan ends with the lines that register its op family's kernels (KILN_VULKAN_KERNEL); the plugin
// adds every one to the registry when it loads (Registry::add_kernel, the call a third-party plugin makes for its
// ShaderKernel).
#pragma once
#include <cstddef>
#include <vector>

#include "encoder.hpp"
#include "kiln/device.hpp"

namespace kiln::vulkan {

struct VulkanKernel {
  // Records the call: checked against the op's contract, supports() and the device's memory, every buffer view
  // trimmed to the bytes the op touches.
  void (*run)(Encoder& e, const OpCall& c) = nullptr;
  // Why this kernel cannot run these attributes on a device with these limits ({} when it can); null: any
  // attributes the op accepts. Called after the backend's own checks (arity, maxStorageBufferRange).
  Support (*supports)(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits) = nullptr;
  // Scratch the call would like in its workspace (it runs without it too); null: none.
  size_t (*workspace_bytes)(const OpCall& c, const DeviceLimits& limits) = nullptr;
  // Records transfer commands only (binds no storage buffer): no maxStorageBufferRange limit on its buffers.
  bool transfer = false;
  // Whether the kernel reads and writes the call's buffer types itself (BufferView::dtype); null or false: it
  // reads float32 only, and the dispatch converts every 16-bit buffer to float32 in the workspace around it.
  // Asked with the planner's unbound views too (no block: offsets unknown), so it decides by types and sizes there.
  bool (*takes_types)(const OpCall& c, const DeviceLimits& limits) = nullptr;
};

// Records a conversion of `count` values of type `from` in `src` into type `to` in `dst` (kernels/vulkan/cast.cpp:
// cast.comp, rounding to nearest even as kiln/half.hpp does; a copy when the types are equal).
void record_cast(Encoder& e, const BufferView& src, DType from, const BufferView& dst, DType to, int64_t count);

struct VulkanKernelEntry {
  const char* op;  // the op's name (op_table.hpp find_op)
  VulkanKernel kernel;
};
// Filled while the plugin's static initializers run (the plugin is built with hidden visibility: one list per plugin).
std::vector<VulkanKernelEntry>& vulkan_kernel_list();

#define KILN_VULKAN_KERNEL_CAT2(a, b) a##b
#define KILN_VULKAN_KERNEL_CAT(a, b) KILN_VULKAN_KERNEL_CAT2(a, b)
// KILN_VULKAN_KERNEL("layer_norm_forward", {run_fn, supports_fn, workspace_fn}) at namespace scope in kernels/vulkan.
#define KILN_VULKAN_KERNEL(op_name, ...)                                                                   \
  [[maybe_unused]] static const bool KILN_VULKAN_KERNEL_CAT(kiln_vulkan_kernel_registered_, __COUNTER__) = \
      (::kiln::vulkan::vulkan_kernel_list().push_back({op_name, ::kiln::vulkan::VulkanKernel __VA_ARGS__}), true)

}  // namespace kiln::vulkan
