// The one checking macro every Vulkan call goes through, and VkResult text.
#pragma once
#include <vulkan/vulkan.h>

#include <string>

namespace kiln::vulkan {

// "VK_ERROR_OUT_OF_DEVICE_MEMORY (a device memory allocation has failed)".
std::string vk_result_text(VkResult r);

// A zeroed Vulkan info struct with its sType set (avoids -Wmissing-field-initializers of `T x{sType}`).
template <class T>
T vk_init(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

// Throws kiln::DeviceError naming the call, where it was made and the VkResult with its meaning.
[[noreturn]] void vk_fail(const char* call, VkResult r, const char* file, int line);

}  // namespace kiln::vulkan

// Evaluates a Vulkan call returning VkResult; anything but VK_SUCCESS throws DeviceError naming the call.
#define KILN_VK_CHECK(call)                                                                       \
  do {                                                                                            \
    const VkResult kiln_vk_r_ = (call);                                                           \
    if (kiln_vk_r_ != VK_SUCCESS) ::kiln::vulkan::vk_fail(#call, kiln_vk_r_, __FILE__, __LINE__); \
  } while (0)
