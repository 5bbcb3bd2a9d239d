#include "vk_check.hpp"

#include <cstring>

#include "kiln/error.hpp"

namespace kiln::vulkan {

std::string vk_result_text(VkResult r) {
  switch (r) {
#define KILN_VK_CASE(name, text) \
  case name:                     \
    return std::string(#name " (") + text + ")";
    KILN_VK_CASE(VK_SUCCESS, "success")
    KILN_VK_CASE(VK_NOT_READY, "not ready")
    KILN_VK_CASE(VK_TIMEOUT, "timeout")
    KILN_VK_CASE(VK_INCOMPLETE, "incomplete result")
    KILN_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY, "a host memory allocation has failed")
    KILN_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY, "a device memory allocation has failed")
    KILN_VK_CASE(VK_ERROR_INITIALIZATION_FAILED, "initialization of an object could not be completed")
    KILN_VK_CASE(VK_ERROR_DEVICE_LOST, "the logical or physical device has been lost")
    KILN_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED, "mapping of a memory object has failed")
    KILN_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT, "a requested layer is not present")
    KILN_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT, "a requested extension is not supported")
    KILN_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT, "a requested feature is not supported")
    KILN_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER, "no compatible Vulkan driver (ICD) was found")
    KILN_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS, "too many objects of this type have been created")
    KILN_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED, "format not supported")
    KILN_VK_CASE(VK_ERROR_FRAGMENTED_POOL, "pool allocation failed due to fragmentation")
    KILN_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY, "a pool memory allocation has failed")
    KILN_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE, "invalid external handle")
    KILN_VK_CASE(VK_ERROR_FRAGMENTATION, "allocation failed due to fragmentation")
    KILN_VK_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS, "invalid opaque capture address")
    KILN_VK_CASE(VK_ERROR_UNKNOWN, "unknown error")
#undef KILN_VK_CASE
    default:
      return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

void vk_fail(const char* call, VkResult r, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw DeviceError(std::string("vulkan: ") + call + " failed with " + vk_result_text(r) + " at " +
                    (base ? base + 1 : file) + ":" + std::to_string(line));
}

}  // namespace kiln::vulkan
