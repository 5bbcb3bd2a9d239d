// From a call's op kind to its kernel, and the checks every op on this backend shares: maxStorageBufferRange, and
// for a plugin's ShaderKernel its binding limit (Device::supports checked the op, its arity and that it has a
// kernel). What a kernel refuses beyond that is its own supports().
//
// 16-bit storage (bfloat16, float16): a kernel that reads float32 only (no VulkanKernel::takes_types, or it declines
// the call) runs on float32 copies of the call's 16-bit buffers in the call's workspace, as on the cpu backend: each
// is converted in with the cast kernel, the kernel runs on the copies, and the outputs are converted back (outputs
// are converted in too: an output may be read-write, and an in-place output shares its input's copy). A barrier
// follows the conversions in; hazard tracking puts the one before the conversions back.
#include "dispatch.hpp"

#include <array>
#include <string>

#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::vulkan {
namespace {

Support no(std::string why) { return {false, std::move(why)}; }

// Each float32 copy starts on this boundary (the llvmpipe GEMM's vec4 loads want 16-byte aligned views, descriptor
// offsets minStorageBufferOffsetAlignment, at most 256 on every device).
constexpr size_t kScratchAlign = 256;
size_t up(size_t b) { return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

bool any_16bit(const OpCall& c) {
  for (const auto& v : c.in)
    if (v.dtype != DType::f32) return true;
  for (const auto& v : c.out)
    if (v.dtype != DType::f32) return true;
  return false;
}

bool same_view(const BufferView& a, const BufferView& b) {
  return a.block && a.block == b.block && a.offset == b.offset && a.dtype == b.dtype;
}

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

bool OpKernels::converts(const OpCall& call, const DeviceLimits& limits) const {
  if (!any_16bit(call)) return false;
  const VulkanKernel* k = find(call.kind);
  return !(k && k->takes_types && k->takes_types(call, limits));
}

// The planner asks with unbound views (no block, bytes and type set): each 16-bit buffer then counts on its own.
// Bound, a buffer that is an input and an output (in place) counts once. One kScratchAlign for the workspace's own
// offset, and the kernel's workspace on the float32 call after the copies.
size_t OpKernels::workspace_bytes(const OpCall& call, const DeviceLimits& limits) const {
  const VulkanKernel* kernel = find(call.kind);
  if (!converts(call, limits)) return kernel && kernel->workspace_bytes ? kernel->workspace_bytes(call, limits) : 0;
  OpCall f = call;
  size_t extra = kScratchAlign;
  std::vector<BufferView> seen;
  for (auto* list : {&f.in, &f.out})
    for (auto& v : *list) {
      if (v.dtype == DType::f32) continue;
      bool dup = false;
      for (const auto& s : seen) dup = dup || same_view(s, v);
      if (!dup) extra += up(v.bytes / 2 * 4);
      seen.push_back(v);
      v.bytes = v.bytes / 2 * 4;
      v.dtype = DType::f32;
    }
  return extra + (kernel && kernel->workspace_bytes ? kernel->workspace_bytes(f, limits) : 0);
}

void OpKernels::run_float32(Encoder& e, const OpCall& call) const {
  if (const VulkanKernel* kernel = find(call.kind)) return kernel->run(e, call);
  run_shader(e, call);
}

void OpKernels::run(Encoder& e, const OpCall& call, const OpArity& arity) const {
  if (!converts(call, e.limits())) return run_float32(e, call);
  struct Copy {
    BufferView orig, copy;
    int64_t count;
  };
  std::vector<Copy> in, back;
  OpCall f = call;
  const BufferView& ws = call.workspace;
  const size_t start = up(ws.offset);
  size_t at = start;
  auto place = [&](BufferView& v, int64_t count, bool output) {
    if (v.dtype == DType::f32) return;
    if (!v.block || v.bytes == 0) {  // an unused output, or nothing to convert
      v.dtype = DType::f32;
      return;
    }
    for (const Copy& c : in)
      if (same_view(c.orig, v)) {  // in place: the input's copy, converted back
        if (output) back.push_back({v, c.copy, count});
        v = c.copy;
        return;
      }
    BufferView copy{ws.block, at, static_cast<size_t>(count) * sizeof(float), DType::f32};
    at += up(copy.bytes);
    in.push_back({v, copy, count});
    if (output) back.push_back({v, copy, count});
    v = copy;
  };
  for (size_t i = 0; i < f.in.size(); ++i) place(f.in[i], arity.in[i], false);
  for (size_t i = 0; i < f.out.size(); ++i) place(f.out[i], arity.out[i], true);
  if (at > ws.offset + ws.bytes || (at > start && !ws.block))
    throw DeviceError("vulkan: op " + std::string(op_name(call.kind)) +
                      " has 16-bit buffers that its kernel reads as float32 copies in the workspace, which needs " +
                      std::to_string(at - ws.offset) + " bytes; the call's workspace holds " +
                      std::to_string(ws.bytes) + " (size it with Device::workspace_bytes)");
  f.workspace.offset = at;
  f.workspace.bytes = ws.offset + ws.bytes - at;
  if (f.workspace.bytes == 0) f.workspace = BufferView{};
  for (const Copy& c : in) record_cast(e, c.orig, c.orig.dtype, c.copy, DType::f32, c.count);
  // Kernels bind buffers they do not touch in some modes (Access::unused, no hazard): a copy bound so must still be
  // complete before the kernel's dispatch, or the validation layer reports a read-after-write hazard.
  if (!in.empty()) e.barrier();
  run_float32(e, f);
  for (const Copy& c : back) record_cast(e, c.copy, DType::f32, c.orig, c.orig.dtype, c.count);
}

}  // namespace kiln::vulkan
