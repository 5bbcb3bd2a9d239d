// The in-process `host` communicator: all-reduce and broadcast across logical CPU devices, exact on integer data.
#include <catch2/catch.hpp>

#include "test_parallel_support.hpp"

using namespace kiln;

TEST_CASE("host all-reduce is exact on integer-valued data across 2 to 4 devices", "[parallel]") {
  for (int n : {2, 3, 4}) {
    test::par::CpuDevices cd(n);
    std::vector<Device*> devs;
    for (auto& d : cd.devs) devs.push_back(d.get());
    auto comm = test::registry().communicator("host")(devs);
    REQUIRE(comm->size() == n);
    // Odd length (not a multiple of any bucket or vector width); values are integers whose sums stay exact in f32.
    const size_t count = 100003;
    std::vector<Allocation> mem;
    std::vector<BufferView> views;
    std::vector<float> expect(count, 0.f);
    for (int r = 0; r < n; ++r) {
      std::vector<float> host(count);
      for (size_t i = 0; i < count; ++i)
        host[i] = static_cast<float>(static_cast<int>((i * 7919 + r * 104729) % 2001) - 1000);
      for (size_t i = 0; i < count; ++i) expect[i] += host[i];
      mem.push_back(cd.allocs[size_t(r)]->allocate(count * sizeof(float), {MemoryTag::gradients, "grad"}));
      views.push_back(mem.back().view());
      devs[size_t(r)]->copy_from_host(host.data(), views.back());
    }
    comm->all_reduce_sum(views, devs);
    for (int r = 0; r < n; ++r) {
      std::vector<float> got(count);
      devs[size_t(r)]->copy_to_host(views[size_t(r)], got.data());
      INFO("devices " << n << " rank " << r);
      CHECK(got == expect);  // bit-exact
    }
    // Broadcast from the last rank overwrites every other rank with its values.
    std::vector<float> root(count);
    for (size_t i = 0; i < count; ++i) root[i] = static_cast<float>(i % 97);
    devs.back()->copy_from_host(root.data(), views.back());
    comm->broadcast(views, devs, n - 1);
    for (int r = 0; r < n; ++r) {
      std::vector<float> got(count);
      devs[size_t(r)]->copy_to_host(views[size_t(r)], got.data());
      CHECK(got == root);
    }
  }
}
