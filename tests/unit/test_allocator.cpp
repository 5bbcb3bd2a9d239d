// The core allocator over a real CPU device: best fit, splitting, coalescing, limits, growth, stats, faults.
#include <catch2/catch.hpp>

#include "kiln/allocator.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {
std::unique_ptr<Device> cpu_device() {
  auto b = test::registry().backend("cpu")(BackendOptions{});
  return b->open(0);
}
constexpr size_t MiB = 1u << 20;
}  // namespace

TEST_CASE("parse_memory_size understands units and percentages", "[allocator]") {
  CHECK(parse_memory_size("1200MiB", 0) == 1200 * MiB);
  CHECK(parse_memory_size("1.5GB", 0) == 1500000000u);
  CHECK(parse_memory_size("800000", 0) == 800000u);
  CHECK(parse_memory_size("60%", 1000) == 600u);
  CHECK_THROWS_AS(parse_memory_size("0%", 1000), ConfigError);
  CHECK_THROWS_AS(parse_memory_size("12 parsecs", 1000), ConfigError);
  CHECK_THROWS_AS(parse_memory_size("-5MB", 1000), ConfigError);
}

TEST_CASE("a memory size of 2^64 bytes or more is refused, not turned into the whole device", "[hardening][sizes]") {
  CHECK(kiln::parse_memory_size("1GiB", 0) == size_t{1} << 30);
  CHECK(kiln::parse_memory_size("16000000TiB", 0) > 0);  // about 1.76e19 bytes, still below 2^64
  for (const char* text : {"1e30GiB", "17000000TiB", "18446744073709551616"}) {
    INFO(text);
    CHECK_THROWS_WITH(kiln::parse_memory_size(text, 0), Catch::Contains(text) && Catch::Contains("16 EiB"));
  }
}

TEST_CASE("allocator splits a block and coalesces freed neighbours", "[allocator]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 8 * MiB;
  o.min_block = 4 * MiB;
  Allocator a(*dev, o);
  auto x = a.allocate(1 * MiB, {MemoryTag::activations, "x"});
  auto y = a.allocate(1 * MiB, {MemoryTag::activations, "y"});
  auto z = a.allocate(1 * MiB, {MemoryTag::activations, "z"});
  CHECK(a.stats().blocks == 1);  // all three came from one 4 MiB block
  CHECK(x.view().block == y.view().block);
  CHECK(y.view().offset == x.view().offset + MiB);
  CHECK(a.stats().largest_free == 1 * MiB);
  x.reset();
  y.reset();  // x and y coalesce into one 2 MiB range
  CHECK(a.stats().largest_free == 2 * MiB);
  auto w = a.allocate(2 * MiB, {MemoryTag::activations, "w"});
  CHECK(w.view().offset == 0);  // best fit reuses the coalesced range, no new block
  CHECK(a.stats().blocks == 1);
  z.reset();
  w.reset();
  CHECK(a.stats().in_use == 0);
  CHECK(a.stats().largest_free == 4 * MiB);
}

TEST_CASE("allocator refuses a request above the memory limit and reports the breakdown", "[allocator]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 4 * MiB;
  Allocator a(*dev, o);
  auto p = a.allocate(3 * MiB, {MemoryTag::parameters, "layer dense_1 weights"});
  try {
    a.allocate(2 * MiB, {MemoryTag::activations, "layer conv2d_3 output"});
    FAIL("allocation above the limit succeeded");
  } catch (const OutOfMemory& e) {
    std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("exceeds the memory limit"));
    CHECK_THAT(m, Catch::Contains("layer conv2d_3 output"));
    CHECK_THAT(m, Catch::Contains("activations"));
    CHECK_THAT(m, Catch::Contains("limit 4.0 MiB"));
    CHECK_THAT(m, Catch::Contains("parameters 3.0 MiB"));
    CHECK_THAT(m, Catch::Contains("largest free range"));
    CHECK(e.requested() == 2 * MiB);
  }
  // The allocator is still usable after the failure.
  auto q = a.allocate(512 * 1024, {MemoryTag::workspace, "ws"});
  CHECK(q);
}

TEST_CASE("growth false reserves the whole limit up front, growth true takes blocks on demand", "[allocator]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 16 * MiB;
  o.growth = false;
  Allocator reserve(*dev, o);
  CHECK(reserve.stats().reserved == 16 * MiB);
  o.growth = true;
  Allocator grow(*dev, o);
  CHECK(grow.stats().reserved == 0);
  auto x = grow.allocate(3 * MiB, {MemoryTag::activations, "x"});
  CHECK(grow.stats().reserved >= 3 * MiB);
  CHECK(grow.stats().reserved <= 16 * MiB);
  x.reset();
  grow.release_free_blocks();
  CHECK(grow.stats().reserved == 0);
}

TEST_CASE("allocator statistics are kept by tag with peaks", "[allocator]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 64 * MiB;
  Allocator a(*dev, o);
  {
    auto p = a.allocate(1 * MiB, {MemoryTag::parameters, "p"});
    auto g = a.allocate(2 * MiB, {MemoryTag::gradients, "g"});
    CHECK(a.stats().in_use_by_tag[size_t(MemoryTag::parameters)] == 1 * MiB);
    CHECK(a.stats().in_use_by_tag[size_t(MemoryTag::gradients)] == 2 * MiB);
  }
  CHECK(a.stats().in_use == 0);
  CHECK(a.stats().peak_in_use == 3 * MiB);
  CHECK(a.stats().peak_by_tag[size_t(MemoryTag::gradients)] == 2 * MiB);
}

TEST_CASE("fault injection at every k fails exactly that block request and leaves the device usable", "[allocator]") {
  auto dev = cpu_device();
  for (int k = 1; k <= 4; ++k) {
    AllocatorOptions o;
    o.limit = 64 * MiB;
    o.min_block = 1 * MiB;
    o.fail_block_request = k;
    Allocator a(*dev, o);
    std::vector<Allocation> held;
    int failures = 0;
    for (int i = 0; i < 4; ++i) {
      try {
        held.push_back(a.allocate(1 * MiB, {MemoryTag::activations, std::string("t").append(std::to_string(i))}));
      } catch (const OutOfMemory& e) {
        ++failures;
        CHECK_THAT(std::string(e.what()), Catch::Contains("fault injection"));
      }
    }
    CHECK(failures == 1);
    CHECK(held.size() == 3);
    auto again = a.allocate(1 * MiB, {MemoryTag::activations, "after"});  // usable after the injected failure
    CHECK(again);
  }
}
