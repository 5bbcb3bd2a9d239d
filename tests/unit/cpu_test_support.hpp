// What the CPU backend's tests share: a device opened with a thread count, several buffers in one block, random data.
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "test_support.hpp"

namespace kiln::test::cpu {

using Vec = std::vector<float>;

struct Opened {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
};

inline Opened open_cpu(int threads, int virtual_devices = 1, int index = 0, bool winograd = true) {
  Opened r;
  r.backend = test::registry().backend("cpu")(BackendOptions::parse(
      "threads = " + std::to_string(threads) + "\nvirtual_devices = " + std::to_string(virtual_devices) +
      "\nwinograd = " + (winograd ? "true" : "false")));
  r.device = r.backend->open(index);
  return r;
}

// One device block holding several buffers at 256-byte aligned offsets (so offsets are exercised).
class Arena {
 public:
  Arena(Device& d, const std::vector<int64_t>& sizes) : d_(d) {
    size_t total = 256;  // the first buffer starts at a non-zero offset
    for (int64_t s : sizes) {
      offsets_.push_back(total);
      total += (static_cast<size_t>(s) * sizeof(float) + 255) / 256 * 256 + 256;
    }
    block_ = d_.allocate_block(total);
    REQUIRE(block_ != nullptr);
    for (size_t i = 0; i < sizes.size(); ++i)
      views_.push_back(BufferView{block_, offsets_[i], static_cast<size_t>(sizes[i]) * sizeof(float)});
  }
  ~Arena() { d_.free_block(block_); }
  const BufferView& view(size_t i) const { return views_[i]; }

 private:
  Device& d_;
  Block* block_ = nullptr;
  std::vector<size_t> offsets_;
  std::vector<BufferView> views_;
};

inline Vec random_vec(int64_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

inline Vec read(Device& d, const BufferView& v) {
  Vec h(v.bytes / sizeof(float));
  d.copy_to_host(v, h.data());
  return h;
}

inline FusedRunner& fused_runner(Device& d) {
  auto* f = static_cast<FusedRunner*>(d.extension(kRunFused));
  REQUIRE(f != nullptr);
  return *f;
}

// max |a - b| / (1 + |b|)
inline double max_rel_diff(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (!std::isnan(a[i])) m = std::max(m, std::abs(double(a[i]) - double(b[i])) / (1.0 + std::abs(double(b[i]))));
  }
  return m;
}

}  // namespace kiln::test::cpu
