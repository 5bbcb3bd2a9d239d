// Kernels that plugins supply for ops (their own, registered with register_op / Registry::add_op), per backend.
// A backend looks up the kind of kernel it runs: "cpu" runs HostKernel, "vulkan" ShaderKernel, "cuda"
// StreamKernel. A backend with no kernel for an op answers supports() with missing_kernel_reason().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/ops.hpp"

namespace kiln {

// Runs on the calling thread with host-addressable buffers (BufferView::host()).
struct HostKernel {
  std::function<void(const OpCall&)> run;
};

// A Vulkan compute shader (SPIR-V, compiled from GLSL that includes Kiln's kiln/vulkan/common.glsl): storage
// buffers at set 0, bindings 0.. = the call's inputs then its outputs; the push-constant block starts with the
// eight binding offsets (base0..base7), then the 32-bit words params() returns (at most 24).
struct ShaderKernel {
  std::string name;                // unique among kernels, e.g. "example.swish_forward"
  std::vector<uint32_t> spirv;
  std::function<std::vector<uint32_t>(const OpCall&)> params;
  std::function<std::array<uint32_t, 3>(const OpCall&)> groups;  // workgroups to dispatch
};

// Enqueues the op on a CUDA stream (`stream` is a cudaStream_t) with device-addressable buffers (ptr + offset).
struct StreamKernel {
  std::function<void(const OpCall&, void* stream)> run;
};

using Kernel = std::variant<HostKernel, ShaderKernel, StreamKernel>;

// Process-wide: registered while plugins load. Registering a kernel for (backend, op) again replaces it.
void register_kernel(const std::string& backend, OpKind op, Kernel k);
const Kernel* find_kernel(const std::string& backend, OpKind op);
template <class K>
const K* find_kernel(const std::string& backend, OpKind op) {
  const Kernel* k = find_kernel(backend, op);
  return k ? std::get_if<K>(k) : nullptr;
}
// "op 'swish' (plugin 'example') has no cpu kernel; kernels exist for: vulkan"
std::string missing_kernel_reason(const std::string& backend, OpKind op);

}  // namespace kiln
