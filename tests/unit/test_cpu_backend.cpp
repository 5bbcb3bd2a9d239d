// The CPU backend: devices, memory and determinism. Every op against the reference is the conformance table's
// job (tests/conformance, on 1, 2 and 3 threads); the op contract checks are in test_op_table.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;
using Vec = std::vector<float>;

namespace {

struct Opened {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
};

Opened open_cpu(int threads, int virtual_devices = 1, int index = 0) {
  Opened r;
  r.backend = test::registry().backend("cpu")(BackendOptions::parse(
      "threads = " + std::to_string(threads) + "\nvirtual_devices = " + std::to_string(virtual_devices)));
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

Vec random_vec(int64_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_CASE("cpu backend enumerates virtual devices with host memory and distinct hardware ids", "[cpu]") {
  auto be = test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 2"));
  CHECK(be->name() == "cpu");
  auto devs = be->enumerate();
  REQUIRE(devs.size() == 2);
  for (const auto& d : devs) {
    CHECK(d.type == DeviceType::cpu);
    CHECK(d.host_addressable);
  }
  CHECK(devs[0].hardware_id == "host-cpu:0");
  CHECK(devs[1].hardware_id == "host-cpu:1");
  CHECK(devs[1].label() == "cpu:1");
  CHECK_THAT(devs[0].name, Catch::Contains("logical 0 of 2"));
  CHECK(devs[0].total_memory > 0);
  CHECK(devs[0].free_memory > 0);
  CHECK(devs[0].free_memory <= devs[0].total_memory);
  auto d1 = be->open(1);
  CHECK(d1->info().index == 1);
  CHECK(d1->query_free_memory() > 0);
  auto d0 = be->open(0);
  CHECK(d0.get() != d1.get());
}

TEST_CASE("cpu backend open with a bad index throws DeviceError naming the index and the devices present", "[cpu]") {
  auto be = test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 2"));
  CHECK_THROWS_AS(be->open(2), DeviceError);
  CHECK_THROWS_WITH(be->open(2), Catch::Contains("cpu:2") && Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
  CHECK_THROWS_AS(be->open(-1), DeviceError);
  CHECK_THROWS_WITH(test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 0")),
                    Catch::Contains("device.virtual_devices") && Catch::Contains("1..64"));
  CHECK_THROWS_WITH(test::registry().backend("cpu")(BackendOptions::parse("threads = -1")),
                    Catch::Contains("device.threads") && Catch::Contains("positive"));
}

TEST_CASE("cpu device blocks are 64-byte aligned, copies round-trip, impossible sizes return nullptr", "[cpu]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  Block* a = d.allocate_block(1000);
  Block* b = d.allocate_block(1000);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(reinterpret_cast<uintptr_t>(a->ptr) % 64 == 0);
  CHECK(a->id != b->id);
  CHECK(a->bytes == 1000);
  Vec src{1, 2, 3, 4}, dst(4);
  d.copy_from_host(src.data(), BufferView{a, 64, 16});
  d.copy_on_device(BufferView{a, 64, 16}, BufferView{b, 128, 16});
  d.copy_to_host(BufferView{b, 128, 16}, dst.data());
  CHECK(dst == src);
  CHECK_THROWS_AS(d.copy_on_device(BufferView{a, 0, 16}, BufferView{b, 0, 8}), DeviceError);
  CHECK_THROWS_AS(d.copy_from_host(src.data(), BufferView{a, 996, 16}), DeviceError);
  d.free_block(a);
  d.free_block(b);
  CHECK(d.allocate_block(size_t(1) << 62) == nullptr);
  d.free_block(nullptr);
  CHECK(d.supports(OpKind::Conv2dBackwardFilter, ConvAttrs{}).yes);
}

TEST_CASE("cpu conv2d backward filter is bit-identical across runs", "[cpu]") {
  auto cpu = open_cpu(2);
  ConvAttrs a{9, 3, 10, 10, 8, 3, 3, 1, 1, 1, 1, 10, 10};
  const auto ar = op_arity(OpKind::Conv2dBackwardFilter, a);
  std::mt19937 g(5);
  Vec x = random_vec(ar.in[0], g), dy = random_vec(ar.in[1], g);
  Arena arena(*cpu.device, {ar.in[0], ar.in[1], ar.out[0]});
  cpu.device->copy_from_host(x.data(), arena.view(0));
  cpu.device->copy_from_host(dy.data(), arena.view(1));
  OpCall c{OpKind::Conv2dBackwardFilter, a, {arena.view(0), arena.view(1)}, {arena.view(2)}, {}};
  const size_t ws = cpu.device->workspace_bytes(c);
  Block* b = cpu.device->allocate_block(ws);
  c.workspace = BufferView{b, 0, ws};
  Vec first(ar.out[0]), second(ar.out[0]);
  cpu.device->run(c);
  cpu.device->copy_to_host(arena.view(2), first.data());
  cpu.device->run(c);
  cpu.device->copy_to_host(arena.view(2), second.data());
  cpu.device->free_block(b);
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}
