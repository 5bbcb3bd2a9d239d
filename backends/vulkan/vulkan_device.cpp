#include "vulkan_device.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "kiln/error.hpp"
#include "vk_check.hpp"

namespace kiln::vulkan {
namespace {

// KILN_VULKAN_LVP_GEMM=0 keeps the generic tiled GEMM on llvmpipe (to compare the two kernels, or to test the tile).
bool env_disables_lvp_gemm() {
  const char* v = std::getenv("KILN_VULKAN_LVP_GEMM");
  return v && std::strcmp(v, "0") == 0;
}

// KILN_VULKAN_16BIT=0 opens the device as if it lacked the 16-bit features (to test the refusal, or to compare).
bool env_disables_16bit() {
  const char* v = std::getenv("KILN_VULKAN_16BIT");
  return v && std::strcmp(v, "0") == 0;
}

constexpr uint32_t kReservedAllocations = 64;  // left for staging chunks and internal buffers
constexpr size_t kCopyPiece = 16u << 20;       // host copies are staged in pieces of one staging chunk

constexpr VkBufferUsageFlags kBlockUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

bool is_oom(VkResult r) { return r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY; }

}  // namespace

VulkanDevice::VulkanDevice(std::shared_ptr<VulkanInstance> instance, const PhysicalDevice& pd)
    : instance_(std::move(instance)), pd_(pd), info_(pd.info) {
  const VkPhysicalDeviceLimits& l = pd_.props.limits;
  limits_.max_range = l.maxStorageBufferRange;
  limits_.offset_align = std::max<size_t>(l.minStorageBufferOffsetAlignment, 4);
  for (int i = 0; i < 3; ++i) limits_.max_groups[i] = l.maxComputeWorkGroupCount[i];
  limits_.llvmpipe_gemm = pd_.llvmpipe_gemm && !env_disables_lvp_gemm();
  if (env_disables_16bit()) pd_.storage_16bit = pd_.shader_float16 = false;

  const float priority = 1.0f;
  auto qi = vk_init<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qi.queueFamilyIndex = pd_.compute_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  std::vector<const char*> exts;
  if (pd_.memory_budget) exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  // 16-bit storage: the shaders that read float16/bfloat16 buffers as 16-bit values (supports_dtype) need these.
  auto s16 = vk_init<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
  auto f16 = vk_init<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  void* features = nullptr;
  if (pd_.storage_16bit) {
    s16.storageBuffer16BitAccess = VK_TRUE;
    features = &s16;
  }
  if (pd_.shader_float16) {
    f16.shaderFloat16 = VK_TRUE;
    f16.pNext = features;
    features = &f16;
    if (pd_.props.apiVersion < VK_API_VERSION_1_2) exts.push_back(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
  }
  auto ci = vk_init<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
  ci.pNext = features;
  ci.queueCreateInfoCount = 1;
  ci.pQueueCreateInfos = &qi;
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  VkDevice dev;
  KILN_VK_CHECK(vkCreateDevice(pd_.handle, &ci, nullptr, &dev));
  device_ = LogicalDevice(dev);
  vkGetDeviceQueue(dev, pd_.compute_family, 0, &queue_);

  // Staging: host-visible and coherent, cached where possible (reads back fast).
  auto bi = vk_init<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = 256;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  VkBuffer probe;
  KILN_VK_CHECK(vkCreateBuffer(dev, &bi, nullptr, &probe));
  Buffer probe_owner(dev, probe);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, probe, &req);
  StreamConfig sc;
  sc.queue_family = pd_.compute_family;
  sc.staging_memory_type =
      find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                       VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  kernels_ = std::make_unique<KernelCache>(dev);
  stream_ = std::make_unique<CommandStream>(dev, queue_, sc);
  dummy_ = make_block(256);
  if (!dummy_) throw DeviceError("vulkan: " + info_.name + " has no memory for a 256-byte buffer");
}

VulkanDevice::~VulkanDevice() {
  try {
    stream_->finish();
  } catch (const std::exception& e) {  // destructors never throw; the device is going away anyway
    std::cerr << "kiln vulkan: error while closing " << info_.label() << ": " << e.what() << "\n";
  }
}

uint32_t VulkanDevice::find_memory_type(uint32_t allowed, VkMemoryPropertyFlags need,
                                        VkMemoryPropertyFlags prefer) const {
  uint32_t found = UINT32_MAX;
  for (uint32_t i = 0; i < pd_.memory.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = pd_.memory.memoryTypes[i].propertyFlags;
    if (!(allowed & (1u << i)) || (f & need) != need) continue;
    if ((f & prefer) == prefer) return i;
    if (found == UINT32_MAX) found = i;
  }
  if (found == UINT32_MAX)
    throw DeviceError("vulkan: " + info_.name + " has no memory type with property flags " + std::to_string(need) +
                      " for buffers (allowed type mask " + std::to_string(allowed) + ")");
  return found;
}

std::unique_ptr<VulkanDevice::DeviceBlock> VulkanDevice::make_block(size_t bytes) {
  VkDevice dev = device_.get();
  auto bi = vk_init<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bi.size = bytes;
  bi.usage = kBlockUsage;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buf;
  VkResult r = vkCreateBuffer(dev, &bi, nullptr, &buf);
  if (is_oom(r)) return nullptr;
  KILN_VK_CHECK(r);
  auto b = std::make_unique<DeviceBlock>();
  b->buffer = Buffer(dev, buf);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buf, &req);
  auto ai = vk_init<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = find_memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  VkDeviceMemory mem;
  r = vkAllocateMemory(dev, &ai, nullptr, &mem);
  if (is_oom(r)) return nullptr;
  KILN_VK_CHECK(r);
  b->memory = Memory(dev, mem);
  KILN_VK_CHECK(vkBindBufferMemory(dev, buf, mem, 0));
  b->block.native = buf;
  b->block.bytes = bytes;
  b->block.id = next_block_id_++;
  return b;
}

Block* VulkanDevice::allocate_block(size_t bytes) {
  // Refuse what the driver would refuse, so the Allocator reports it as out of memory, never a crash.
  const uint32_t type = find_memory_type(~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  const size_t heap = pd_.memory.memoryHeaps[pd_.memory.memoryTypes[type].heapIndex].size;
  if (bytes == 0 || bytes > pd_.max_allocation_bytes || bytes > pd_.max_buffer_bytes || bytes > heap) return nullptr;
  if (blocks_.size() + kReservedAllocations >= pd_.props.limits.maxMemoryAllocationCount) return nullptr;
  auto b = make_block(bytes);
  if (!b) return nullptr;
  Block* out = &b->block;
  allocated_bytes_ += bytes;
  blocks_.emplace(out, std::move(b));
  return out;
}

void VulkanDevice::free_block(Block* b) noexcept {
  auto it = blocks_.find(b);
  if (it == blocks_.end()) return;
  try {
    stream_->finish();  // recorded or running work may still use the block
  } catch (const std::exception& e) {
    std::cerr << "kiln vulkan: error while waiting to free a block on " << info_.label() << ": " << e.what() << "\n";
  }
  allocated_bytes_ -= b->bytes;
  blocks_.erase(it);
}

size_t VulkanDevice::query_free_memory() {
  info_.free_memory = instance_->free_memory(pd_, allocated_bytes_);
  return info_.free_memory;
}

void VulkanDevice::check_owned(const BufferView& v, const char* what) const {
  if (v.bytes == 0 || blocks_.count(v.block)) return;
  throw DeviceError(std::string("vulkan: ") + what + " is not memory of " + info_.label() + " (" + info_.name +
                    "); allocate it with an Allocator on this device");
}

void VulkanDevice::do_copy_from_host(const void* src, const BufferView& dst) {
  check_owned(dst, "copy_from_host destination");
  for (size_t done = 0; done < dst.bytes; done += kCopyPiece) {
    const size_t n = std::min(kCopyPiece, dst.bytes - done);
    const StagingSlice s = stream_->staging(n);
    std::memcpy(s.host, static_cast<const char*>(src) + done, n);
    VkBuffer buf = static_cast<VkBuffer>(dst.block->native);
    stream_->hazard({}, {Range{buf, dst.offset + done, dst.offset + done + n}});
    const VkBufferCopy region{s.offset, dst.offset + done, n};
    vkCmdCopyBuffer(stream_->cmd(), s.buffer, buf, 1, &region);
    stream_->end_op();
  }
}

void VulkanDevice::do_copy_to_host(const BufferView& src, void* dst) {
  check_owned(src, "copy_to_host source");
  for (size_t done = 0; done < src.bytes; done += kCopyPiece) {
    const size_t n = std::min(kCopyPiece, src.bytes - done);
    const StagingSlice s = stream_->staging(n);
    VkBuffer buf = static_cast<VkBuffer>(src.block->native);
    stream_->hazard({Range{buf, src.offset + done, src.offset + done + n}}, {});
    const VkBufferCopy region{src.offset + done, s.offset, n};
    vkCmdCopyBuffer(stream_->cmd(), buf, s.buffer, 1, &region);
    stream_->finish(/*host_read=*/true);
    std::memcpy(static_cast<char*>(dst) + done, s.host, n);
  }
}

// Device::copy_on_device refused unequal sizes and overlapping views (vkCmdCopyBuffer forbids overlapping regions).
void VulkanDevice::do_copy_on_device(const BufferView& src, const BufferView& dst) {
  check_owned(src, "copy_on_device source");
  check_owned(dst, "copy_on_device destination");
  encoder().copy(src, dst);
  stream_->end_op();
}

bool VulkanDevice::runs_kernel(const Kernel& k) const { return k.get<VulkanKernel>() || k.get<ShaderKernel>(); }

Support VulkanDevice::do_supports(OpKind kind, const OpAttrs& attrs, const OpArity& arity, const Kernel& k) const {
  return ops_.supports(kind, attrs, arity, k, limits_);
}

// float16 buffers are read as float16 values (the native GEMM), bfloat16 ones as 16-bit integers widened in the
// shader; every other kernel sees float32 copies (OpKernels::run, dispatch.cpp).
Support VulkanDevice::supports_dtype(DType t) const {
  if (t == DType::f32) return {};
  std::vector<const char*> need{"VkPhysicalDevice16BitStorageFeatures::storageBuffer16BitAccess"};
  if (t == DType::f16) need.insert(need.begin(), "VkPhysicalDeviceShaderFloat16Int8Features::shaderFloat16");
  std::string all, lacks;
  for (const char* n : need) {
    all += (all.empty() ? "" : " and ") + std::string(n);
    const bool has = std::strstr(n, "shaderFloat16") ? pd_.shader_float16 : pd_.storage_16bit;
    if (!has) lacks += (lacks.empty() ? "" : " and ") + std::string(n);
  }
  if (lacks.empty()) return {};
  return {false, std::string("the vulkan backend's ") + dtype_name(t) + " storage needs " + all + ", and " +
                     info_.name + " (" + info_.label() + ") lacks " + lacks +
                     (env_disables_16bit() ? " (KILN_VULKAN_16BIT=0 is set)" : "")};
}

size_t VulkanDevice::workspace_bytes(const OpCall& call) const { return ops_.workspace_bytes(call, limits_); }

// Calls arrive checked against the op's contract and this device's supports() (the executor, when it binds).
// What only this device can tell stays here: every buffer is memory of this device (a foreign VkBuffer would
// crash the driver, not raise an error).
bool VulkanDevice::do_run(const OpCall& call) {
  if (!ops_.has_kernel(call.kind)) return false;
  const OpArity ar = op_arity(call.kind, call.attrs);
  // The label is built only for a buffer that fails: this runs for every op of every step.
  auto owned = [&](const BufferView& v, const char* kind, size_t i) {
    if (v.bytes == 0 || (v.block && blocks_.count(v.block) && v.offset + v.bytes <= v.block->bytes)) return;
    if (!v.block || v.offset > v.block->bytes || v.bytes > v.block->bytes - v.offset)
      throw DeviceError("vulkan: op " + std::string(op_name(call.kind)) + " " + kind + "[" + std::to_string(i) +
                        "] is not inside a block (bind calls through check_call)");
    check_owned(v, ("op " + std::string(op_name(call.kind)) + " " + kind + "[" + std::to_string(i) + "]").c_str());
  };
  for (size_t i = 0; i < call.in.size(); ++i) owned(call.in[i], "input", i);
  for (size_t i = 0; i < call.out.size(); ++i) owned(call.out[i], "output", i);
  owned(call.workspace, "workspace", 0);
  // Kernels bind (and hazard tracking sees) exactly the bytes the op touches, not whole views.
  OpCall trimmed = call;
  for (size_t i = 0; i < trimmed.in.size(); ++i) trimmed.in[i].bytes = storage_bytes(ar.in[i], trimmed.in[i].dtype);
  for (size_t i = 0; i < trimmed.out.size(); ++i) trimmed.out[i].bytes = storage_bytes(ar.out[i], trimmed.out[i].dtype);
  Encoder enc = encoder();
  ops_.run(enc, trimmed, ar);
  stream_->end_op();
  return true;
}

void VulkanDevice::synchronize() { stream_->finish(); }

void VulkanDevice::begin_sequence(uint64_t) { stream_->begin_sequence(); }

void VulkanDevice::end_sequence() { stream_->end_sequence(); }

void* VulkanDevice::extension(std::string_view name) {
  if (name == kValidationMessagesExtension)
    return instance_->validation() ? &instance_->validation_messages() : nullptr;
  if (name == "vulkan.submissions") {
    submissions_ = stream_->submissions();
    return &submissions_;
  }
  if (name == "vulkan.vendor") return const_cast<char*>(pd_.vendor.c_str());
  if (name == "vulkan.describe") {
    description_ = pd_.describe() + "llvmpipe GEMM kernel in use: " + (limits_.llvmpipe_gemm ? "yes" : "no") +
                   "\nfree (budget): " + std::to_string(query_free_memory() >> 20) + " MiB\n";
    return const_cast<char*>(description_.c_str());
  }
  if (name == "vulkan.debug.submit_test_message")
    return instance_->submit_test_message() ? &instance_->validation_messages() : nullptr;
  if (name == "vulkan.pipelines") {
    pipelines_ = kernels_->created();
    return &pipelines_;
  }
  return nullptr;
}

}  // namespace kiln::vulkan
