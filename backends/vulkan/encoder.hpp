// What op implementations see: records kernel dispatches with their buffer bindings into the command stream.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "command_stream.hpp"
#include "kiln/device.hpp"
#include "kiln/kernel_registry.hpp"
#include "pipeline_cache.hpp"

namespace kiln::vulkan {

struct DeviceLimits {
  size_t max_range = 0;      // maxStorageBufferRange: the largest view a kernel can bind
  size_t offset_align = 16;  // minStorageBufferOffsetAlignment
  uint32_t max_groups[3] = {65535, 65535, 65535};
  bool llvmpipe_gemm = false;  // PhysicalDevice::llvmpipe_gemm: gemm/batched_gemm may use gemm_lvp_*.comp
};

// `unused`: bound because the kernel declares it, but not touched by this dispatch (no hazard).
enum class Access : uint8_t { read, write, read_write, unused };
struct Bind {
  BufferView view;
  Access access;
};
inline Bind rd(const BufferView& v) { return {v, Access::read}; }
inline Bind wr(const BufferView& v) { return {v, Access::write}; }
inline Bind rw(const BufferView& v) { return {v, Access::read_write}; }
inline Bind unused(const BufferView& v) { return {v, Access::unused}; }

class Encoder {
 public:
  Encoder(CommandStream& stream, KernelCache& kernels, const DeviceLimits& limits, VkBuffer dummy)
      : stream_(stream), kernels_(kernels), limits_(limits), dummy_(dummy) {}

  // Records kernel `name` over groups (gx, gy, gz) with `binds` at bindings 0.. and `params` after the
  // binding offsets in the push constants. A barrier is recorded first when a binding depends on earlier work.
  template <class Params>
  void dispatch(const char* name, std::initializer_list<Bind> binds, const Params& params, uint32_t gx, uint32_t gy = 1,
                uint32_t gz = 1) {
    static_assert(sizeof(Params) <= kPushConstantBytes - 32, "kernel parameters exceed the push-constant block");
    dispatch_raw(name, std::span<const Bind>(binds.begin(), binds.size()), &params, sizeof(Params), gx, gy, gz);
  }
  // A plugin's kernel (kiln/kernel_registry.hpp): its module is created on first use.
  void dispatch_shader(const ShaderKernel& k, std::span<const Bind> binds, const std::vector<uint32_t>& params,
                       uint32_t gx, uint32_t gy, uint32_t gz);
  // Records a transfer of `src` into the first src.bytes of `dst` (vkCmdCopyBuffer: no kernel, no
  // maxStorageBufferRange limit); nothing for an empty view or a view onto itself. Throws DeviceError when the two
  // overlap otherwise.
  void copy(const BufferView& src, const BufferView& dst);
  // A full barrier: everything recorded before it is visible to everything after (hazard tracking starts over).
  void barrier() { stream_.barrier(); }
  // Workgroups for a grid-stride loop over `n` items with `local` invocations each.
  uint32_t groups_for(int64_t n, uint32_t local = 256) const;
  const DeviceLimits& limits() const { return limits_; }

 private:
  void dispatch_raw(const char* name, std::span<const Bind> binds, const void* params, size_t bytes, uint32_t gx,
                    uint32_t gy, uint32_t gz, const std::vector<uint32_t>* spirv = nullptr);
  CommandStream& stream_;
  KernelCache& kernels_;
  const DeviceLimits& limits_;
  VkBuffer dummy_;
};

}  // namespace kiln::vulkan
