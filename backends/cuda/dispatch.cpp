// The op dispatch of CudaDevice: which registered kernel answers do_supports(), workspace_bytes() and do_run() for
// a call (Device::supports checks the op and finds its kernel first), and the registrars the op families in
// kernels/cuda use (cuda_kernel.hpp). No op is named here: a built-in op's CUDA kernel is a CudaKernel its family
// registered, a plugin's op a StreamKernel.
//
// 16-bit storage, as in the cpu backend: a kernel that reads float32 only (no CudaKernel::takes_types, or it
// declines the call; every StreamKernel) gets the call's 16-bit buffers as float32 copies in the workspace. The
// conversions are cast kernels on the op stream, before and after the kernel, so they are ordered with it and a
// CUDA graph captures them with the op. Matrix products and casts read 16-bit storage themselves.
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_device.hpp"
#include "cuda_kernel.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda {
namespace {

const std::string& backend_name() {
  static const std::string name = "cuda";
  return name;
}

struct Family {
  const char* name;
  void (*register_fn)();
};
std::vector<Family>& families() {
  static std::vector<Family> f;
  return f;
}

std::vector<DeviceStateMaker>& state_makers() {
  static std::vector<DeviceStateMaker> m;
  return m;
}

// The float32 copies start 256-byte aligned, like the workspace (cuBLAS, cuDNN and vector loads want that), and
// the kernel's own workspace follows them, aligned too.
constexpr size_t kScratchAlign = 256;
size_t align_up(size_t b) { return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

bool any_16bit(const OpCall& c) {
  for (const auto& v : c.in)
    if (v.dtype != DType::f32) return true;
  for (const auto& v : c.out)
    if (v.dtype != DType::f32) return true;
  return false;
}

// Whether the device converts the call's 16-bit buffers around kernel `k` (null: none registered).
bool converts(const Kernel* k, const OpCall& c) {
  if (!any_16bit(c)) return false;
  const CudaKernel* ck = k ? k->get<CudaKernel>() : nullptr;
  return !(ck && ck->takes_types && ck->takes_types(c));
}

// A 16-bit buffer of b bytes (storage_bytes: rounded up to 4) holds b / 2 values, its float32 copy b / 2 * 4 bytes.
size_t values_of(const BufferView& v) { return v.bytes / 2; }

// The float32 call a converting kernel runs: each 16-bit buffer replaced by a float32 one in the workspace (bound
// buffers that are the same 16-bit view, an op run in place, share one copy), the kernel's own workspace after
// them. Also sizes the copies for workspace_bytes, where the planner passes unbound views (no block: each gets
// its own copy, which can only overestimate).
struct Converted {
  OpCall call;
  size_t scratch = 0;                                  // bytes of the copies at the start of the workspace
  std::vector<std::pair<BufferView, BufferView>> in;   // (16-bit original, float32 copy), converted before the kernel
  std::vector<std::pair<BufferView, BufferView>> out;  // converted back after it
};

Converted convert_layout(const OpCall& c) {
  Converted r;
  r.call = c;
  std::vector<std::pair<BufferView, BufferView>> seen;
  auto place = [&](BufferView& v, bool output) {
    if (v.dtype == DType::f32) return;
    if (v.bytes == 0) {  // nothing to read or write: only its type changes, so the kernel sees float32 only
      v.dtype = DType::f32;
      return;
    }
    if (v.block)
      for (const auto& [orig, copy] : seen)
        if (orig.block == v.block && orig.offset == v.offset && orig.bytes == v.bytes && orig.dtype == v.dtype) {
          if (output) r.out.emplace_back(v, copy);  // in place: the input's copy, converted back
          v = copy;
          return;
        }
    BufferView f;
    f.block = c.workspace.block;
    f.offset = c.workspace.offset + r.scratch;
    f.bytes = values_of(v) * sizeof(float);
    f.dtype = DType::f32;
    r.scratch += align_up(f.bytes);
    if (v.block) {
      seen.emplace_back(v, f);
      r.in.emplace_back(v, f);  // outputs too: an output may be read-write (beta != 0, accumulated gradients)
      if (output) r.out.emplace_back(v, f);
    }
    v = f;
  };
  for (auto& v : r.call.in) place(v, false);
  for (auto& v : r.call.out) place(v, true);
  r.call.workspace.offset = c.workspace.offset + r.scratch;
  r.call.workspace.bytes = c.workspace.bytes > r.scratch ? c.workspace.bytes - r.scratch : 0;
  return r;
}

}  // namespace

bool list_kernel_family(const char* family, void (*register_fn)()) {
  families().push_back({family, register_fn});
  return true;
}

void register_builtin_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const Family& f : families()) {
      try {
        f.register_fn();
      } catch (const Error& e) {
        throw Error(std::string("cuda kernels of family '") + f.name + "': " + e.what());
      }
    }
  });
}

void register_cuda_kernel(OpKind op, CudaKernel k) {
  const OpDesc& d = op_desc(op);
  if (!k.run) throw Error("cuda kernel of op '" + d.name + "' has no run function");
  if (d.step_scalars != kStepNone && !k.pack_step_scalars)
    throw Error("cuda kernel of op '" + d.name +
                "' reads per-step scalars but has no pack_step_scalars (a CUDA graph would replay stale values)");
  if (k.workspace_required && !k.workspace)
    throw Error("cuda kernel of op '" + d.name + "' requires a workspace but does not size it");
  register_kernel(backend_name(), op, std::move(k));
}

const CudaKernel* find_cuda_kernel(OpKind op) { return find_kernel<CudaKernel>(backend_name(), op); }

size_t add_device_state(const char* name, MakeDeviceState make) {
  state_makers().push_back({name, make});
  return state_makers().size() - 1;
}

const std::vector<DeviceStateMaker>& device_state_makers() { return state_makers(); }

bool pack_step_scalars(const OpCall& call, void* slot) {
  if (!op_known(call.kind) || op_desc(call.kind).step_scalars == kStepNone) return false;
  // A plugin's StreamKernel has no slot: it reads its attributes as recorded (architecture.md: not supported
  // inside a graph). A CudaKernel of such an op has pack_step_scalars (register_cuda_kernel checks).
  const CudaKernel* k = find_cuda_kernel(call.kind);
  if (!k) return false;
  std::memset(slot, 0, kStepScalarSlotBytes);
  k->pack_step_scalars(call, slot);
  return true;
}

bool CudaDevice::runs_kernel(const Kernel& k) const { return k.get<CudaKernel>() || k.get<StreamKernel>(); }

// Device::supports checked the op, its attributes and found its kernel; a plugin's StreamKernel refuses nothing.
Support CudaDevice::do_supports(OpKind kind, const OpAttrs& attrs, const OpArity&, const Kernel& k) const {
  const CudaKernel* ck = k.get<CudaKernel>();
  return ck && ck->support ? ck->support(kind, attrs) : Support{};
}

// bfloat16 needs Ampere's conversions and cuBLAS/cuDNN bf16 kernels; float16 tensor cores arrived with Volta.
Support CudaDevice::supports_dtype(DType t) const {
  const int need = t == DType::bf16 ? 8 : t == DType::f16 ? 7 : 0;
  if (cc_major_ >= need) return {};
  return {false, info_.label() + " (" + info_.name + ") has compute capability " + std::to_string(cc_major_) + "." +
                     std::to_string(cc_minor_) + "; the cuda backend runs " + dtype_name(t) + " storage from " +
                     std::to_string(need) + ".0 on (set [precision] compute = \"float32\", or use another device)"};
}

size_t CudaDevice::workspace_bytes(const OpCall& call) const {
  const Kernel* any = find_kernel(backend_name(), call.kind);
  const CudaKernel* k = any ? any->get<CudaKernel>() : nullptr;
  if (!converts(any, call)) return k && k->workspace ? k->workspace(*this, call) : 0;
  const Converted cv = convert_layout(call);
  return cv.scratch + (k && k->workspace ? k->workspace(*this, cv.call) : 0);
}

bool CudaDevice::do_run(const OpCall& call) {
  // Looked up here, before the call may be recorded into a graph: a call without a kernel enqueues nothing.
  const Kernel* k = find_kernel(backend_name(), call.kind);
  if (!k || !runs_kernel(*k)) return false;
  validate(call, k->get<CudaKernel>());
  std::lock_guard lock(mu_);
  activate();
  graphs_->run(call);
  return true;
}

// Buffer counts and sizes were checked when the call was bound (check_call); what remains is CUDA's own.
void CudaDevice::validate(const OpCall& call, const CudaKernel* k) const {
  const std::string op = info_.label() + " op " + std::string(op_name(call.kind));
  // cuBLAS refuses a workspace below 256-byte alignment; the core allocator aligns every allocation to 256.
  if (call.workspace.block && call.workspace.bytes > 0 &&
      reinterpret_cast<uintptr_t>(static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset) % 256 != 0)
    throw DeviceError(op + ": the workspace must start at a 256-byte aligned address, found offset " +
                      std::to_string(call.workspace.offset) + " in its block");
  const Kernel* any = find_kernel(backend_name(), call.kind);
  if (converts(any, call)) {
    // The float32 copies must fit whatever the kernel itself can do without.
    const size_t need = k && k->workspace_required ? workspace_bytes(call) : convert_layout(call).scratch;
    if (need > 0 && (!call.workspace.block || call.workspace.bytes < need))
      throw DeviceError(op + ": needs a workspace of " + std::to_string(need) +
                        " bytes (float32 copies of its 16-bit buffers" +
                        (k && k->workspace_required ? std::string(" and the kernel's own scratch") : std::string()) +
                        "), was given " + std::to_string(call.workspace.bytes) + " (ask Device::workspace_bytes)");
  } else if (k && k->workspace_required) {
    const size_t need = k->workspace(*this, call);
    if (!call.workspace.block || call.workspace.bytes < need)
      throw DeviceError(op + ": needs a workspace of " + std::to_string(need) + " bytes, was given " +
                        std::to_string(call.workspace.bytes) + " (ask Device::workspace_bytes)");
  }
}

void CudaDevice::execute(const OpCall& c, const void* scalars) {
  const Kernel* k = find_kernel(backend_name(), c.kind);
  if (converts(k, c)) {
    const Converted cv = convert_layout(c);
    for (const auto& [orig, copy] : cv.in)
      cast_values(stream_.get(), orig.raw(), orig.dtype, copy.raw(), DType::f32, static_cast<int64_t>(values_of(orig)));
    execute_kernel(k, cv.call, scalars);
    for (const auto& [orig, copy] : cv.out)
      cast_values(stream_.get(), copy.raw(), DType::f32, orig.raw(), orig.dtype, static_cast<int64_t>(values_of(orig)));
    return;
  }
  execute_kernel(k, c, scalars);
}

void CudaDevice::execute_kernel(const Kernel* k, const OpCall& c, const void* scalars) {
  if (const CudaKernel* ck = k ? k->get<CudaKernel>() : nullptr)
    return ck->run(CudaOp{*this, c, stream_.get(), scalars});
  if (const StreamKernel* sk = k ? k->get<StreamKernel>() : nullptr) return sk->run(c, stream_.get());
  // do_run found the kernel before enqueuing; only a plugin re-registering it as another kind gets here.
  throw DeviceError(info_.label() + ": the kernel of op " + std::string(op_name(c.kind)) +
                    " was replaced by one of a kind this backend does not run after the call was enqueued");
}

}  // namespace kiln::cuda
