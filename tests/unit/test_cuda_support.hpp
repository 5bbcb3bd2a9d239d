// Helpers of the CUDA backend tests: the plugin's backend when it was built, a device when one is present (or
// the reason there is none), and device buffers that free themselves.
#pragma once
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "test_support.hpp"

namespace kiln::test::cuda {

inline std::filesystem::path plugin_path() { return std::filesystem::path(KILN_PLUGIN_DIR) / "libkiln_cuda.so"; }
// The plugin's runtime part (everything that links CUDA), loaded by the plugin on first use.
inline std::filesystem::path impl_path() {
  return std::filesystem::path(KILN_PLUGIN_DIR) / "cuda" / "libkiln_cuda_impl.so";
}

// The "cuda" backend, or null with `why` set when this build has no CUDA plugin.
inline std::unique_ptr<Backend> backend_or_reason(std::string& why) {
  if (!registry().has_backend("cuda")) {
    why = std::filesystem::exists(plugin_path())
              ? "libkiln_cuda.so exists but did not register the cuda backend"
              : "this build has no CUDA backend (nvcc or the CUDA toolkit was not found)";
    return nullptr;
  }
  return registry().backend("cuda")(BackendOptions{});
}

// Device `index` of the cuda backend, or null with `why` saying why not (no plugin, no driver, no device).
inline std::unique_ptr<Device> device_or_reason(std::string& why, int index = 0) {
  auto b = backend_or_reason(why);
  if (!b) return nullptr;
  const auto devices = b->enumerate();
  if (devices.empty()) {
    why = "no CUDA device: " + b->unavailable_reason();
    return nullptr;
  }
  if (index >= static_cast<int>(devices.size())) {
    why = "only " + std::to_string(devices.size()) + " CUDA device(s)";
    return nullptr;
  }
  return b->open(index);
}

// A device block holding f32 values; frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer(Device& d, size_t bytes) : d_(d), b_(bytes ? d.allocate_block(bytes) : nullptr), bytes_(bytes) {
    if (bytes && !b_) FAIL("allocate_block(" << bytes << ") returned null");
  }
  DeviceBuffer(Device& d, const std::vector<float>& v) : DeviceBuffer(d, v.size() * sizeof(float)) { upload(v); }
  ~DeviceBuffer() {
    if (b_) d_.free_block(b_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  BufferView view() const { return BufferView{b_, 0, bytes_}; }
  void upload(const std::vector<float>& v) {
    if (!v.empty()) d_.copy_from_host(v.data(), BufferView{b_, 0, v.size() * sizeof(float)});
  }
  std::vector<float> download() const {
    std::vector<float> v(bytes_ / sizeof(float));
    if (!v.empty()) d_.copy_to_host(view(), v.data());
    return v;
  }

 private:
  Device& d_;
  Block* b_;
  size_t bytes_;
};

}  // namespace kiln::test::cuda

// Leaves the test case as skipped (test_support.hpp) when `ptr` is null, saying why.
#define KILN_CUDA_SKIP_IF_NO(ptr, why) \
  do {                                 \
    if (!(ptr)) KILN_SKIP(why);        \
  } while (0)
