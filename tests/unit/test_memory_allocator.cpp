// The allocator's harder cases on a real CPU device: fragmentation, giving whole blocks back, reserve mode,
// fault injection across a whole workload, peaks, and the advice hook of OOM reports. A fault injection block request
// that a run never makes is refused where it is written, and a run stays within the bound it is checked against.
#include <catch2/catch.hpp>
#include <random>
#include <sstream>

#include "kiln/allocator.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/session.hpp"
#include "kiln/trainer.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

constexpr size_t MiB = 1u << 20;

std::unique_ptr<Device> cpu_device() { return test::registry().backend("cpu")(BackendOptions{})->open(0); }

std::string oom_text(Allocator& a, size_t bytes) {
  try {
    a.allocate(bytes, {MemoryTag::activations, "probe"});
  } catch (const OutOfMemory& e) {
    return e.what();
  }
  return "<allocated>";
}

// Sum of the sizes of the live allocations, padded the way the allocator pads them.
size_t padded_sum(const std::vector<Allocation>& held) {
  size_t s = 0;
  for (const auto& h : held)
    if (h) s += std::max<size_t>(256, (h.bytes() + 255) / 256 * 256);
  return s;
}

}  // namespace

TEST_CASE("a request that fits the limit but no free range is reported as fragmentation", "[memory]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 4 * MiB;
  o.growth = false;  // one 4 MiB block
  Allocator a(*dev, o);
  std::vector<Allocation> held;
  for (int i = 0; i < 4; ++i) held.push_back(a.allocate(MiB, {MemoryTag::activations, "x"}));
  held[0].reset();
  held[2].reset();  // 2 MiB free, in two separate 1 MiB ranges
  CHECK(a.stats().largest_free == MiB);
  CHECK(a.stats().fragmentation() == Approx(0.5));
  std::string m = oom_text(a, 2 * MiB);
  CHECK_THAT(m, Catch::Contains("fragmentation"));
  CHECK_THAT(m, Catch::Contains("largest free range is 1.0 MiB"));
  held[1].reset();  // coalesces 0..3 MiB
  CHECK(a.stats().fragmentation() == Approx(0.0));
  CHECK(a.allocate(3 * MiB, {MemoryTag::activations, "y"}));
}

TEST_CASE("growth gives whole free blocks back to make room for a larger one under the limit", "[memory]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 8 * MiB;
  o.min_block = MiB;
  Allocator a(*dev, o);
  std::vector<Allocation> held;
  for (int i = 0; i < 8; ++i) held.push_back(a.allocate(MiB, {MemoryTag::activations, "x"}));
  CHECK(a.stats().blocks == 8);
  CHECK(a.stats().reserved == 8 * MiB);
  for (int i = 0; i < 6; ++i) held[size_t(i)].reset();  // six whole free blocks, none big enough alone
  auto big = a.allocate(5 * MiB, {MemoryTag::parameters, "big"});
  CHECK(big);
  CHECK(a.stats().reserved <= 8 * MiB);
  CHECK(a.stats().blocks == 3);  // two 1 MiB blocks still in use, plus the new one
}

TEST_CASE("growth = false that cannot reserve its limit fails at construction and leaves nothing behind", "[memory]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 8 * MiB;
  o.growth = false;
  o.max_block = 2 * MiB;  // four block requests
  for (int k = 1; k <= 4; ++k) {
    o.fail_block_request = k;
    INFO("failing block request " << k);
    CHECK_THROWS_WITH(Allocator(*dev, o), Catch::Contains("cannot reserve the memory limit 8.0 MiB"));
  }
  o.fail_block_request = 0;
  Allocator ok(*dev, o);
  CHECK(ok.stats().reserved == 8 * MiB);
  CHECK(ok.stats().blocks == 4);
}

TEST_CASE("fault injection at every k over a mixed workload keeps the statistics exact and the device usable",
          "[memory]") {
  auto dev = cpu_device();
  auto workload = [](Allocator& a, std::vector<Allocation>& held, int& failures) {
    std::mt19937 rng(3);
    for (int i = 0; i < 40; ++i) {
      size_t bytes = (rng() % 2048 + 1) * 1024;
      try {
        held.push_back(a.allocate(bytes, {MemoryTag(rng() % 6), "t"}));
      } catch (const OutOfMemory& e) {
        ++failures;
        CHECK_THAT(std::string(e.what()), Catch::Contains("fault injection"));
      }
      if (rng() % 3 == 0 && !held.empty()) held[rng() % held.size()].reset();
      // Invariants after every step, failed or not.
      REQUIRE(a.stats().in_use == padded_sum(held));
      size_t by_tag = 0;
      for (auto t : a.stats().in_use_by_tag) by_tag += t;
      REQUIRE(by_tag == a.stats().in_use);
      REQUIRE(a.stats().reserved <= a.limit());
      REQUIRE(a.stats().largest_free <= a.stats().reserved - a.stats().in_use);
    }
  };
  AllocatorOptions base;
  base.limit = 64 * MiB;
  base.min_block = MiB;
  size_t requests = 0;
  {
    Allocator a(*dev, base);
    std::vector<Allocation> held;
    int failures = 0;
    workload(a, held, failures);
    CHECK(failures == 0);
    requests = a.stats().block_requests;
  }
  REQUIRE(requests > 3);
  for (size_t k = 1; k <= requests; ++k) {
    INFO("failing block request " << k);
    AllocatorOptions o = base;
    o.fail_block_request = int(k);
    Allocator a(*dev, o);
    std::vector<Allocation> held;
    int failures = 0;
    workload(a, held, failures);
    CHECK(failures == 1);
    held.clear();
    CHECK(a.stats().in_use == 0);
    // Usable afterwards: the whole workload runs again without a failure.
    int again = 0;
    workload(a, held, again);
    CHECK(again == 0);
  }
}

namespace {

// dense 4 -> 2 (2 parameters), Adam (2 state tensors each): 6 persistent tensors.
const std::string kModel = "[model]\ninput_shape = [4]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 2\n";

std::string config_error(const std::string& toml) {
  try {
    Session s(Config::load_string(toml, "run.toml"), test::registry());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<ok>";
}

}  // namespace

TEST_CASE("fault_injection_block beyond the single reservation of growth = false is refused",
          "[hardening][fault_injection]") {
  const std::string m = config_error("[device]\ngrowth = false\nfault_injection_block = 2\n" + kModel);
  CHECK_THAT(m, Catch::Contains("run.toml:3: key 'device.fault_injection_block'") && Catch::Contains("is 2") &&
                    Catch::Contains("growth = false") && Catch::Contains("1 block request") &&
                    Catch::Contains("#2 never happens"));
  CHECK(config_error("[device]\ngrowth = false\nfault_injection_block = 1\n" + kModel) == "<ok>");
  CHECK(config_error("[device]\ngrowth = false\nfault_injection_block = 0\n" + kModel) == "<ok>");
}

TEST_CASE("fault_injection_block beyond the block requests a growing run can make is refused, naming the count",
          "[hardening][fault_injection]") {
  // 2 x 30 planned reservations + 4 x (6 persistent tensors + 4 regions x 30 step graphs) = 564.
  const std::string m = config_error("[device]\nfault_injection_block = 565\n" + kModel);
  CHECK_THAT(m, Catch::Contains("run.toml:2: key 'device.fault_injection_block'") && Catch::Contains("is 565") &&
                    Catch::Contains("at most 564 block requests") && Catch::Contains("6 persistent tensors") &&
                    Catch::Contains("1 to 564"));
  CHECK(config_error("[device]\nfault_injection_block = 564\n" + kModel) == "<ok>");
  CHECK_THAT(config_error("[device]\nfault_injection_block = 1000000\n" + kModel), Catch::Contains("at most 564"));
}

TEST_CASE("a training run makes no more block requests than the bound fault_injection_block is checked against",
          "[hardening][fault_injection]") {
  auto dir = test::temp_dir("never-fires-count");
  std::ostringstream toml;
  toml << "[device]\nbackend = \"cpu\"\nmemory_limit = \"64MiB\"\nfault_injection_block = 564\n"
       << kModel << "[train]\nepochs = 2\nbatch_size = 3\nprogress = \"none\"\noutput_dir = \""
       << (dir / "out").string() << "\"\n"
       << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], classes = 2, examples = 10}]\n"
       << "[data.test]\nstages = [{type = \"synthetic\", shape = [4], classes = 2, examples = 7}]\n";
  Session s(Config::load_string(toml.str(), (dir / "run.toml").string()), test::registry());
  std::ostringstream out;
  Trainer(s, out).run();
  INFO(out.str());
  REQUIRE(s.devices().size() == 1);
  const size_t made = s.devices()[0].allocator->stats().block_requests;
  CHECK(made >= 1);
  CHECK(made < 564);
}

TEST_CASE("reset_peak starts a new measurement window and OOM advice comes from the provider", "[memory]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 4 * MiB;
  Allocator a(*dev, o);
  { auto x = a.allocate(3 * MiB, {MemoryTag::activations, "x"}); }
  auto y = a.allocate(MiB, {MemoryTag::gradients, "y"});
  CHECK(a.stats().peak_in_use == 3 * MiB);
  a.reset_peak();
  CHECK(a.stats().peak_in_use == MiB);
  CHECK(a.stats().peak_by_tag[size_t(MemoryTag::activations)] == 0);
  CHECK(a.stats().peak_by_tag[size_t(MemoryTag::gradients)] == MiB);
  int calls = 0;
  a.set_oom_hint("fixed hint\n");
  a.set_oom_hint_provider([&] {
    ++calls;
    return std::string("what would fit: batch size 7\n");
  });
  std::string m = oom_text(a, 5 * MiB);
  CHECK_THAT(m, Catch::Contains("the request alone exceeds the memory limit"));
  CHECK_THAT(m, Catch::Contains("fixed hint\nwhat would fit: batch size 7"));
  CHECK(calls == 1);
  a.set_oom_hint_provider([]() -> std::string { throw std::runtime_error("planner failed"); });
  m = oom_text(a, 4 * MiB);  // a throwing provider never hides the report itself
  CHECK_THAT(m, Catch::Contains("exceeds the memory limit (1.0 MiB in use + 4.0 MiB requested > 4.0 MiB)"));
  CHECK_THAT(m, Catch::Contains("gradients 1.0 MiB"));
}

TEST_CASE("reserving the planned total as one block packs allocations that block-by-block growth cannot", "[memory]") {
  auto dev = cpu_device();
  AllocatorOptions o;
  o.limit = 8 * MiB;
  o.min_block = 2 * MiB;
  const size_t sizes[] = {MiB / 2, 7 * MiB / 4, 9 * MiB / 2};  // 6.75 MiB in all, under the 8 MiB limit
  {
    Allocator a(*dev, o);
    auto x = a.allocate(sizes[0], {MemoryTag::parameters, "x"});  // a 2 MiB block, 1.5 MiB left in it
    auto y = a.allocate(sizes[1], {MemoryTag::gradients, "y"});   // does not fit the tail: another 2 MiB block
    CHECK_THAT(oom_text(a, sizes[2]), Catch::Contains("fragmentation"));
  }
  Allocator a(*dev, o);
  REQUIRE(a.reserve(sizes[0] + sizes[1] + sizes[2]));
  CHECK(a.stats().blocks == 1);
  std::vector<Allocation> held;
  for (size_t s : sizes) held.push_back(a.allocate(s, {MemoryTag::activations, "planned"}));
  CHECK(a.stats().blocks == 1);
  CHECK(a.stats().in_use == a.stats().reserved);
  CHECK_FALSE(a.reserve(9 * MiB));  // beyond the limit: refused, nothing changed
  CHECK(a.stats().reserved == sizes[0] + sizes[1] + sizes[2]);
}
