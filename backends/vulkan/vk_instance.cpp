#include "vk_instance.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>

#include "kiln/error.hpp"
#include "vk_check.hpp"

namespace kiln::vulkan {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

bool has_layer(const char* name) {
  uint32_t n = 0;
  KILN_VK_CHECK(vkEnumerateInstanceLayerProperties(&n, nullptr));
  std::vector<VkLayerProperties> layers(n);
  KILN_VK_CHECK(vkEnumerateInstanceLayerProperties(&n, layers.data()));
  for (const auto& l : layers)
    if (std::strcmp(l.layerName, name) == 0) return true;
  return false;
}

bool has_instance_extension(const char* name) {
  uint32_t n = 0;
  KILN_VK_CHECK(vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr));
  std::vector<VkExtensionProperties> exts(n);
  KILN_VK_CHECK(vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data()));
  for (const auto& e : exts)
    if (std::strcmp(e.extensionName, name) == 0) return true;
  return false;
}

std::vector<std::string> device_extensions(VkPhysicalDevice pd) {
  uint32_t n = 0;
  KILN_VK_CHECK(vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr));
  std::vector<VkExtensionProperties> exts(n);
  KILN_VK_CHECK(vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data()));
  std::vector<std::string> names;
  for (const auto& e : exts) names.emplace_back(e.extensionName);
  return names;
}

// Counts validation and performance warnings/errors; general (loader) messages are printed, not counted.
VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT type,
                                                const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  static std::mutex mu;
  const bool counted =
      (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) &&
      (type & (VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT));
  if (counted) static_cast<std::atomic<uint64_t>*>(user)->fetch_add(1);
  std::lock_guard<std::mutex> lock(mu);
  std::cerr << "[vulkan " << (counted ? "validation" : "loader") << "] " << (data->pMessage ? data->pMessage : "")
            << "\n";
  return VK_FALSE;
}

std::string vendor_name(uint32_t id) {
  switch (id) {
    case 0x10de:
      return "NVIDIA";
    case 0x1002:
      return "AMD";
    case 0x8086:
      return "Intel";
    case 0x13b5:
      return "ARM";
    case 0x5143:
      return "Qualcomm";
    case 0x1010:
      return "Imagination";
    case 0x106b:
      return "Apple";
    case VK_VENDOR_ID_MESA:
      return "Mesa (software)";
    default: {
      char buf[16];
      std::snprintf(buf, sizeof buf, "0x%04x", id);
      return buf;
    }
  }
}

std::string format_uuid(const uint8_t* u) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

}  // namespace

std::shared_ptr<VulkanInstance> VulkanInstance::create(bool validation) {
  std::shared_ptr<VulkanInstance> inst(new VulkanInstance());
  if (validation && !has_layer(kValidationLayer))
    throw DeviceError(std::string("vulkan: validation was requested ([device] validation = true or "
                                  "KILN_VULKAN_VALIDATION=1) but ") +
                      kValidationLayer + " is not installed; install it (Debian: vulkan-validationlayers)");
  if (validation && !has_instance_extension(VK_EXT_DEBUG_UTILS_EXTENSION_NAME))
    throw DeviceError("vulkan: validation needs " VK_EXT_DEBUG_UTILS_EXTENSION_NAME ", which the loader lacks");

  auto app = vk_init<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "kiln";
  app.pEngineName = "kiln";
  app.apiVersion = VK_API_VERSION_1_2;

  std::vector<const char*> layers, exts;
  auto dbg = vk_init<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  dbg.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  dbg.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  dbg.pfnUserCallback = on_debug_message;
  dbg.pUserData = &inst->messages_;
  // Synchronization validation checks the barriers between recorded ops, not only API usage.
  VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  auto features = vk_init<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = enables;
  features.pNext = &dbg;

  auto ci = vk_init<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.pApplicationInfo = &app;
  if (validation) {
    layers.push_back(kValidationLayer);
    exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    ci.pNext = &features;  // also covers messages from vkCreateInstance itself
  }
  ci.enabledLayerCount = static_cast<uint32_t>(layers.size());
  ci.ppEnabledLayerNames = layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(exts.size());
  ci.ppEnabledExtensionNames = exts.data();
  KILN_VK_CHECK(vkCreateInstance(&ci, nullptr, &inst->instance_));
  inst->validation_ = validation;

  if (validation) {
    auto create_messenger = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(inst->instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (!create_messenger) throw DeviceError("vulkan: vkCreateDebugUtilsMessengerEXT is missing from the loader");
    KILN_VK_CHECK(create_messenger(inst->instance_, &dbg, nullptr, &inst->messenger_));
  }
  inst->enumerate();
  return inst;
}

VulkanInstance::~VulkanInstance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

void VulkanInstance::enumerate() {
  uint32_t n = 0;
  KILN_VK_CHECK(vkEnumeratePhysicalDevices(instance_, &n, nullptr));
  std::vector<VkPhysicalDevice> pds(n);
  KILN_VK_CHECK(vkEnumeratePhysicalDevices(instance_, &n, pds.data()));
  for (VkPhysicalDevice h : pds) {
    PhysicalDevice pd;
    pd.handle = h;
    vkGetPhysicalDeviceProperties(h, &pd.props);
    if (pd.props.apiVersion < VK_API_VERSION_1_1) continue;  // needs properties2, maintenance3, device ids

    for (const auto& e : device_extensions(h)) {
      if (e == VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) pd.memory_budget = true;
      if (e == VK_EXT_PCI_BUS_INFO_EXTENSION_NAME) pd.pci_bus_info = true;
      if (e == "VK_KHR_cooperative_matrix") pd.cooperative_matrix_khr = true;
      if (e == VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) pd.cooperative_matrix_nv = true;
      if (e == VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME) pd.float16_int8_ext = true;
    }
    {  // the features 16-bit storage needs (VulkanDevice::supports_dtype)
      auto f2 = vk_init<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
      auto s16 =
          vk_init<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
      auto f16 = vk_init<VkPhysicalDeviceShaderFloat16Int8Features>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
      f2.pNext = &s16;
      if (pd.props.apiVersion >= VK_API_VERSION_1_2 || pd.float16_int8_ext) s16.pNext = &f16;
      vkGetPhysicalDeviceFeatures2(h, &f2);
      pd.storage_16bit = s16.storageBuffer16BitAccess == VK_TRUE;
      pd.shader_float16 = (pd.props.apiVersion >= VK_API_VERSION_1_2 || pd.float16_int8_ext) && f16.shaderFloat16;
    }
    auto p2 = vk_init<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    auto ids = vk_init<VkPhysicalDeviceIDProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES);
    auto m3 =
        vk_init<VkPhysicalDeviceMaintenance3Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
    auto pci =
        vk_init<VkPhysicalDevicePCIBusInfoPropertiesEXT>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT);
    auto sub = vk_init<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
    p2.pNext = &sub;
    sub.pNext = &ids;
    ids.pNext = &m3;
    auto m4 =
        vk_init<VkPhysicalDeviceMaintenance4Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES);
    void** tail = &m3.pNext;
    if (pd.pci_bus_info) {
      *tail = &pci;
      tail = &pci.pNext;
    }
    if (pd.props.apiVersion >= VK_API_VERSION_1_3) *tail = &m4;
    vkGetPhysicalDeviceProperties2(h, &p2);
    pd.max_allocation_bytes = m3.maxMemoryAllocationSize;
    pd.max_buffer_bytes = pd.props.apiVersion >= VK_API_VERSION_1_3 ? m4.maxBufferSize : SIZE_MAX;
    pd.llvmpipe_gemm = std::string(pd.props.deviceName).find("llvmpipe") != std::string::npos &&
                       sub.subgroupSize == 8 && (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                       (sub.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);

    uint32_t qn = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(h, &qn, nullptr);
    std::vector<VkQueueFamilyProperties> qf(qn);
    vkGetPhysicalDeviceQueueFamilyProperties(h, &qn, qf.data());
    for (uint32_t i = 0; i < qn; ++i) {  // a compute-only family first (async compute), else any with compute
      if (!(qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
      if (pd.compute_family == UINT32_MAX || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) pd.compute_family = i;
    }
    if (pd.compute_family == UINT32_MAX) continue;

    vkGetPhysicalDeviceMemoryProperties(h, &pd.memory);
    pd.vendor = vendor_name(pd.props.vendorID);
    DeviceInfo& info = pd.info;
    info.backend = "vulkan";
    info.index = static_cast<int>(devices_.size());
    info.name = pd.props.deviceName;
    switch (pd.props.deviceType) {
      case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
        info.type = DeviceType::gpu;
        break;
      case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        info.type = DeviceType::integrated_gpu;
        break;
      case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
        info.type = DeviceType::virtual_gpu;
        break;
      case VK_PHYSICAL_DEVICE_TYPE_CPU:  // lavapipe
        info.type = DeviceType::cpu;
        break;
      default:
        info.type = DeviceType::other;
        break;
    }
    info.host_addressable = false;  // blocks are VkBuffers; the host reaches them through staging copies
    if (pd.pci_bus_info) {          // the Linux sysfs form, as CUDA's and nvidia-smi's bus ids normalise to
      char buf[32];
      std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", pci.pciDomain, pci.pciBus, pci.pciDevice, pci.pciFunction);
      info.hardware_id = buf;
    } else {
      info.hardware_id = "uuid:" + format_uuid(ids.deviceUUID);
    }
    for (uint32_t i = 0; i < pd.memory.memoryHeapCount; ++i)
      if (pd.memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        info.total_memory += pd.memory.memoryHeaps[i].size;
    devices_.push_back(std::move(pd));
    devices_.back().info.free_memory = free_memory(devices_.back(), 0);
  }
}

bool VulkanInstance::submit_test_message() {
  if (!validation_) return false;
  auto submit = reinterpret_cast<PFN_vkSubmitDebugUtilsMessageEXT>(
      vkGetInstanceProcAddr(instance_, "vkSubmitDebugUtilsMessageEXT"));
  if (!submit) return false;
  auto data = vk_init<VkDebugUtilsMessengerCallbackDataEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CALLBACK_DATA_EXT);
  data.pMessageIdName = "kiln-self-test";
  data.pMessage = "kiln self-test: a message sent on purpose to check that validation messages are counted";
  submit(instance_, VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT, VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
         &data);
  return true;
}

std::string PhysicalDevice::describe() const {
  static const char* kTypes[] = {"other", "integrated GPU", "discrete GPU", "virtual GPU", "CPU"};
  const VkPhysicalDeviceLimits& l = props.limits;
  auto ver = [](uint32_t v) {
    return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
           std::to_string(VK_API_VERSION_PATCH(v));
  };
  std::string s = "vendor: " + vendor + "\ntype: " + (props.deviceType <= 4 ? kTypes[props.deviceType] : "?") +
                  "\napi: " + ver(props.apiVersion) + "\nhardware id: " + info.hardware_id + "\n";
  for (uint32_t i = 0; i < memory.memoryHeapCount; ++i)
    s += "heap " + std::to_string(i) + ": " + std::to_string(memory.memoryHeaps[i].size >> 20) + " MiB" +
         (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT ? " device-local" : "") + "\n";
  s += "maxStorageBufferRange: " + std::to_string(l.maxStorageBufferRange) +
       "\nmaxMemoryAllocationCount: " + std::to_string(l.maxMemoryAllocationCount) +
       "\nmaxMemoryAllocationSize: " + std::to_string(max_allocation_bytes) +
       "\nmaxComputeSharedMemorySize: " + std::to_string(l.maxComputeSharedMemorySize) + "\n";
  s += std::string("VK_EXT_memory_budget: ") + (memory_budget ? "yes" : "no") +
       "\nVK_EXT_pci_bus_info: " + (pci_bus_info ? "yes" : "no") + "\nVK_KHR_cooperative_matrix: " +
       (cooperative_matrix_khr ? "present, unused (see kernels/vulkan/README.md)" : "no") +
       "\nstorageBuffer16BitAccess: " + (storage_16bit ? "yes" : "no") +
       "\nshaderFloat16: " + (shader_float16 ? "yes" : "no") +
       "\nllvmpipe GEMM kernel: " + (llvmpipe_gemm ? "yes (gemm_lvp, unless KILN_VULKAN_LVP_GEMM=0)" : "no") + "\n";
  return s;
}

size_t VulkanInstance::free_memory(const PhysicalDevice& pd, size_t used_by_us) const {
  if (pd.memory_budget) {
    auto budget = vk_init<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
    auto mp = vk_init<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
    mp.pNext = &budget;
    vkGetPhysicalDeviceMemoryProperties2(pd.handle, &mp);
    size_t free = 0;
    for (uint32_t i = 0; i < mp.memoryProperties.memoryHeapCount; ++i)
      if (mp.memoryProperties.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        free += budget.heapBudget[i] > budget.heapUsage[i] ? budget.heapBudget[i] - budget.heapUsage[i] : 0;
    return free;
  }
  // Without the budget extension the driver tells only heap sizes: subtract what this process took.
  return pd.info.total_memory > used_by_us ? pd.info.total_memory - used_by_us : 0;
}

}  // namespace kiln::vulkan
