// What every device checks, written once for every backend (device.hpp): the copies' views, copy_on_device's sizes
// and overlap, and whether the backend has a kernel for an op. Backends implement the protected do_* functions and
// never repeat these checks, so the contract cannot drift apart between them.
#include <exception>
#include <string>

#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln {
namespace {

std::string range(const BufferView& v) {
  return std::to_string(v.bytes) + " bytes at offset " + std::to_string(v.offset);
}

// A view of n > 0 bytes has a block and lies inside it. Written so that offset + bytes cannot wrap around.
void check_view(const Device& d, const char* fn, const char* what, const BufferView& v) {
  if (v.bytes == 0) return;
  if (!v.block)
    throw DeviceError(d.info().label() + " " + fn + ": " + what + " of " + std::to_string(v.bytes) +
                      " bytes has no block");
  if (v.offset > v.block->bytes || v.bytes > v.block->bytes - v.offset)
    throw DeviceError(d.info().label() + " " + fn + ": " + what + " (" + range(v) + ") is outside its block of " +
                      std::to_string(v.block->bytes) + " bytes");
}

void check_host(const Device& d, const char* fn, const char* what, const void* p, size_t bytes) {
  if (bytes && !p)
    throw DeviceError(d.info().label() + " " + fn + ": " + what + " is a null host pointer for " +
                      std::to_string(bytes) + " bytes");
}

std::string op_label(OpKind kind) {
  const OpDesc& d = op_desc(kind);
  return "op '" + d.name + "' (plugin '" + d.plugin + "')";
}

}  // namespace

void Device::copy_from_host(const void* src, const BufferView& dst) {
  check_view(*this, "copy_from_host", "destination", dst);
  check_host(*this, "copy_from_host", "source", src, dst.bytes);
  if (dst.bytes) do_copy_from_host(src, dst);
}

void Device::copy_to_host(const BufferView& src, void* dst) {
  check_view(*this, "copy_to_host", "source", src);
  check_host(*this, "copy_to_host", "destination", dst, src.bytes);
  if (src.bytes) do_copy_to_host(src, dst);
}

void Device::copy_on_device(const BufferView& src, const BufferView& dst) {
  if (src.bytes != dst.bytes)
    throw DeviceError(info().label() + " copy_on_device: source has " + std::to_string(src.bytes) +
                      " bytes, destination " + std::to_string(dst.bytes) + " (sizes must be equal)");
  check_view(*this, "copy_on_device", "source", src);
  check_view(*this, "copy_on_device", "destination", dst);
  if (src.bytes == 0 || (src.block == dst.block && src.offset == dst.offset)) return;
  if (src.overlaps(dst))
    throw DeviceError(info().label() + " copy_on_device: source (" + range(src) + ") and destination (" + range(dst) +
                      ") overlap in one block; only a view copied onto itself may (copy through a separate buffer)");
  do_copy_on_device(src, dst);
}

uint64_t Device::upload_async(const void* src, const BufferView& dst) {
  check_view(*this, "upload_async", "destination", dst);
  check_host(*this, "upload_async", "source", src, dst.bytes);
  return do_upload_async(src, dst);
}

Support Device::supports_dtype(DType t) const {
  if (t == DType::f32) return {};
  return {false, "the " + info().backend + " backend computes in float32 only; " + dtype_name(t) +
                     " is not available on it (set [precision] compute = \"float32\", or use a backend that has it: "
                     "kiln devices)"};
}

Support Device::supports(OpKind kind, const OpAttrs& attrs) const {
  if (!op_known(kind)) return {false, "unknown op kind " + std::to_string(static_cast<int>(kind))};
  OpArity ar;
  try {
    ar = op_arity(kind, attrs);
  } catch (const std::exception& e) {  // a plugin's arity function may throw anything: it is still a "no"
    return {false, e.what()};
  }
  for (const auto* list : {&ar.in, &ar.out})
    for (size_t i = 0; i < list->size(); ++i)
      if ((*list)[i] < 0)
        return {false, op_label(kind) + ": " + (list == &ar.in ? "input " : "output ") + std::to_string(i) +
                           " has a negative size of " + std::to_string((*list)[i]) + " floats"};
  const Kernel* k = find_kernel(info().backend, kind);
  if (!k) return {false, missing_kernel_reason(info().backend, kind)};
  if (!runs_kernel(*k))
    return {false, op_label(kind) + " has a " + info().backend +
                       " kernel of a kind this backend does not run (see kernel_registry.hpp for each backend's kind)"};
  return do_supports(kind, attrs, ar, *k);
}

void Device::run(const OpCall& call) {
  if (do_run(call)) return;
  // Asked only when the device found no kernel: a registry lookup for every op of every step would cost.
  const Support s = supports(call.kind, call.attrs);
  throw DeviceError(
      info().label() + ": " +
      (s.yes ? op_label(call.kind) + " has a kernel registered after this device looked its kernels up" : s.reason));
}

}  // namespace kiln
