// The cpu backend's op dispatch: every op runs the kernel registered for it on "cpu" (kernels/cpu registers the
// core's ops as CpuKernel, plugins register HostKernel). Calls arrive checked (check_call, when the executor binds),
// so kernels take their buffers as they come.
//
// 16-bit storage: a kernel that reads float32 only (no CpuKernel::takes_types, or it declines the call) gets its
// 16-bit buffers as float32 copies in the workspace: inputs and outputs converted in, outputs converted back (an
// output may be read-write). Every op thus runs under a 16-bit policy with float32 arithmetic; the kernels that
// matter for speed (products, convolutions, pooling, normalization, activations, elementwise ops, losses: see
// docs/conformance.md) read 16-bit storage themselves.
#include <algorithm>
#include <string>
#include <vector>

#include "backend.hpp"
#include "cpu_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/half.hpp"
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

namespace {

constexpr size_t kAlign = 64;
size_t up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

bool any_16bit(const OpCall& c) {
  for (const auto& v : c.in)
    if (v.dtype != DType::f32) return true;
  for (const auto& v : c.out)
    if (v.dtype != DType::f32) return true;
  return false;
}

bool converts(const CpuKernel* k, const OpCall& c) {
  return any_16bit(c) && !(k && k->takes_types && k->takes_types(c));
}

// The float32 call a converting kernel runs: each 16-bit buffer replaced by a float32 one at `offset` of the
// workspace (buffers that are the same 16-bit view share one), the kernel's own workspace after them.
struct Converted {
  OpCall call;
  std::vector<std::pair<BufferView, BufferView>> in;   // (16-bit original, float32 copy), converted in
  std::vector<std::pair<BufferView, BufferView>> out;  // converted back after the kernel
};

Converted convert_layout(const OpCall& c) {
  Converted r;
  r.call = c;
  size_t at = 0;
  std::vector<std::pair<BufferView, BufferView>> seen;
  auto place = [&](BufferView& v, bool output) {
    if (v.dtype == DType::f32) return;
    if (v.bytes == 0 || !v.block) {  // nothing to convert, but the float32 kernel must not see a 16-bit label
      v.dtype = DType::f32;
      return;
    }
    for (const auto& [orig, copy] : seen)
      if (orig.block == v.block && orig.offset == v.offset && orig.bytes == v.bytes && orig.dtype == v.dtype) {
        if (output) r.out.emplace_back(v, copy);  // in place: the input's copy, converted back
        v = copy;
        return;
      }
    BufferView f;
    f.block = c.workspace.block;
    f.offset = c.workspace.offset + at;
    f.bytes = v.bytes / 2 * 4;
    f.dtype = DType::f32;
    at += up(f.bytes);
    seen.emplace_back(v, f);
    r.in.emplace_back(v, f);  // outputs too: an output may be read-write
    if (output) r.out.emplace_back(v, f);
    v = f;
  };
  for (auto& v : r.call.in) place(v, false);
  for (auto& v : r.call.out) place(v, true);
  r.call.workspace.offset = c.workspace.offset + at;
  r.call.workspace.bytes = c.workspace.bytes > at ? c.workspace.bytes - at : 0;
  return r;
}

// Converts n values on the pool, in slices of 64 Ki values.
void convert(ThreadPool& pool, const void* src, DType from, void* dst, DType to, size_t n) {
  constexpr size_t kSlice = 1 << 16;
  const auto slices = static_cast<int64_t>((n + kSlice - 1) / kSlice);
  pool.run(slices, [&](int64_t s, int) {
    const size_t b = static_cast<size_t>(s) * kSlice, e = std::min(n, b + kSlice);
    if (from == DType::f32)
      from_float(static_cast<const float*>(src) + b, static_cast<uint16_t*>(dst) + b, to, e - b);
    else
      to_float(static_cast<const uint16_t*>(src) + b, from, static_cast<float*>(dst) + b, e - b);
  });
}

}  // namespace

// Every op runs on 16-bit storage: natively where its kernel takes the types, else converted around the kernel. A
// "yes" with a reason is a notice the run prints: the type works here, at a cost worth knowing before step 1.
Support CpuDevice::supports_dtype(DType t) const {
  if (t == DType::f16)
    return {true,
            "float16 on the cpu backend is stored in 16 bits, but its ops compute on float32 copies (this backend has "
            "no float16 arithmetic), so a step runs several times slower than in float32; bfloat16 runs its products "
            "natively where the CPU has AVX512_BF16"};
  if (t == DType::bf16 && !__builtin_cpu_supports("avx512bf16"))
    return {true,
            "this CPU has no AVX512_BF16: bfloat16 products run through oneDNN's emulation or on float32 copies, "
            "slower than float32 (the memory saving stays)"};
  return {};
}

size_t CpuDevice::workspace_bytes(const OpCall& call) const {
  const CpuKernel* k = kernel(call.kind);
  if (!converts(k, call)) return k && k->workspace_bytes ? k->workspace_bytes(*this, call) : 0;
  OpCall f = call;
  size_t extra = 0;
  std::vector<std::pair<const Block*, size_t>> seen;
  for (auto* list : {&f.in, &f.out})
    for (auto& v : *list) {
      if (v.dtype == DType::f32) continue;
      const bool dup = v.block && std::find(seen.begin(), seen.end(), std::pair{v.block, v.offset}) != seen.end();
      if (!dup) extra += up(v.bytes / 2 * 4);
      if (v.block) seen.emplace_back(v.block, v.offset);
      v.bytes = v.bytes / 2 * 4;
      v.dtype = DType::f32;
    }
  return extra + (k && k->workspace_bytes ? k->workspace_bytes(*this, f) : 0);
}

bool CpuDevice::do_run(const OpCall& call) {
  const CpuKernel* k = kernel(call.kind);
  const HostKernel* host = k ? nullptr : find_kernel<HostKernel>("cpu", call.kind);
  if (!k && !host) return false;
  if (!converts(k, call)) {
    if (k)
      k->run(*this, call);
    else
      host->run(call);
    return true;
  }
  Converted cv = convert_layout(call);
  for (const auto& [orig, copy] : cv.in) convert(pool_, orig.raw(), orig.dtype, copy.raw(), DType::f32, orig.bytes / 2);
  if (k)
    k->run(*this, cv.call);
  else
    host->run(cv.call);
  for (const auto& [orig, copy] : cv.out)
    convert(pool_, copy.raw(), DType::f32, orig.raw(), orig.dtype, orig.bytes / 2);
  return true;
}

}  // namespace kiln::cpu
