// Kernels for ops, per backend: one registry for the built-in ops and for plugins' ops alike. The core stores and
// finds kernels and never looks inside one, so a backend brings its own kinds of kernel without a core change.
// The kinds declared here are the ones third-party plugins use: HostKernel for "cpu", ShaderKernel for "vulkan",
// StreamKernel for "cuda". A backend's own kernels may use a kind of its own (one that sees the backend's device).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
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
  std::string name;  // unique among kernels, e.g. "example.swish_forward"
  std::vector<uint32_t> spirv;
  std::function<std::vector<uint32_t>(const OpCall&)> params;
  std::function<std::array<uint32_t, 3>(const OpCall&)> groups;  // workgroups to dispatch
};

// Enqueues the op on a CUDA stream (`stream` is a cudaStream_t) with device-addressable buffers (ptr + offset).
struct StreamKernel {
  std::function<void(const OpCall&, void* stream)> run;
};

// A kernel of any kind K (copyable): Kernel k = HostKernel{...}; k.get<HostKernel>() is null for another kind.
class Kernel {
 public:
  template <class K, class = std::enable_if_t<!std::is_same_v<std::decay_t<K>, Kernel>>>
  Kernel(K k) : impl_(std::make_shared<const K>(std::move(k))), type_(&typeid(K)) {}  // NOLINT: implicit on purpose
  template <class K>
  const K* get() const {
    return type_ && *type_ == typeid(K) ? static_cast<const K*>(impl_.get()) : nullptr;
  }

 private:
  std::shared_ptr<const void> impl_;  // the deleter lives in the registering library, which is never unloaded
  const std::type_info* type_ = nullptr;
};

// Process-wide: registered while plugins load. Registering a kernel for (backend, op) again replaces it.
void register_kernel(const std::string& backend, OpKind op, Kernel k);
const Kernel* find_kernel(const std::string& backend, OpKind op);
template <class K>
const K* find_kernel(const std::string& backend, OpKind op) {
  const Kernel* k = find_kernel(backend, op);
  return k ? k->get<K>() : nullptr;
}

// A backend that cannot run an op at all says so once, with the reason; supports() answers with it, the completeness
// check accepts it and docs/op_support.md shows it.
void declare_unsupported(const std::string& backend, OpKind op, std::string reason);
// The declared reason, or "" when `backend` did not declare `op` unsupported.
std::string unsupported_reason(const std::string& backend, OpKind op);
// "op 'swish' (plugin 'example') has no cpu kernel; kernels exist for: vulkan", or the declared reason.
std::string missing_kernel_reason(const std::string& backend, OpKind op);
// The ops of the core's op set that `backend` has neither a kernel for nor declared unsupported, by name. A
// backend is complete when this is empty once its plugin has registered (a test checks every built backend).
std::vector<std::string> missing_builtin_kernels(const std::string& backend);

}  // namespace kiln
