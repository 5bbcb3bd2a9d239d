// The cpu backend's own kind of kernel: it runs on the device's thread pool and scratch. Each file of kernels/cpu
// ends with the lines that register its op family's kernels (KILN_CPU_KERNEL); the plugin adds every one to the
// registry when it loads (Registry::add_kernel, the call a third-party plugin makes for its HostKernel).
#pragma once
#include <cstddef>
#include <vector>

#include "backend.hpp"
#include "kiln/device.hpp"

namespace kiln::cpu {

struct CpuKernel {
  void (*run)(CpuDevice& d, const OpCall& c) = nullptr;
  // Why this kernel cannot run these attributes ({} when it can); null: any attributes the op accepts.
  Support (*supports)(OpKind kind, const OpAttrs& attrs) = nullptr;
  // Scratch the call needs in its workspace; null: none.
  size_t (*workspace_bytes)(const CpuDevice& d, const OpCall& c) = nullptr;
  // Whether run() reads and writes these buffers in the types they hold (BufferView::dtype); null: float32 only.
  // For any other call the backend converts 16-bit buffers to float32 in the workspace around run() (dispatch.cpp).
  bool (*takes_types)(const OpCall& c) = nullptr;
};

// A call's buffers as host pointers (null for an unbound one, e.g. an output the op ignores).
inline const float* in(const OpCall& c, size_t i) { return c.in[i].block ? c.in[i].host() : nullptr; }
inline float* out(const OpCall& c, size_t i) { return c.out[i].block ? c.out[i].host() : nullptr; }
inline float* ws(const OpCall& c) { return c.workspace.block ? c.workspace.host() : nullptr; }
template <class A>
const A& attrs(const OpCall& c) {
  return std::get<A>(c.attrs);
}

struct CpuKernelEntry {
  const char* op;  // the op's name (op_table.hpp find_op)
  CpuKernel kernel;
};
// Filled while the plugin's static initializers run (the plugin is built with hidden visibility: one list per plugin).
std::vector<CpuKernelEntry>& cpu_kernel_list();

#define KILN_CPU_KERNEL_CAT2(a, b) a##b
#define KILN_CPU_KERNEL_CAT(a, b) KILN_CPU_KERNEL_CAT2(a, b)
// KILN_CPU_KERNEL("layer_norm_forward", {run_fn, supports_fn, workspace_fn}) at namespace scope in kernels/cpu.
#define KILN_CPU_KERNEL(op_name, ...)                                                                \
  [[maybe_unused]] static const bool KILN_CPU_KERNEL_CAT(kiln_cpu_kernel_registered_, __COUNTER__) = \
      (::kiln::cpu::cpu_kernel_list().push_back({op_name, ::kiln::cpu::CpuKernel __VA_ARGS__}), true)

}  // namespace kiln::cpu
