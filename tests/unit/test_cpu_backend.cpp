// The CPU backend: devices, memory and determinism. Every op against the reference is the conformance table's
// job (tests/conformance, on 1, 2 and 3 threads); the op contract checks are in test_op_table.cpp. A thread count
// the host cannot use is a config error naming [device] threads, and a thread pool that cannot start its threads is
// a DeviceError, never std::terminate.
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_test_support.hpp"
#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;
using namespace kiln::test::cpu;

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

namespace {

std::unique_ptr<kiln::Backend> cpu_backend(int threads) {
  return kiln::test::registry().backend("cpu")(kiln::BackendOptions::parse("threads = " + std::to_string(threads)));
}

}  // namespace

TEST_CASE("cpu backend refuses a thread count far above the host's cores, naming [device] threads",
          "[hardening][threads]") {
  for (int threads : {100000, 1025}) {
    INFO(threads);
    CHECK_THROWS_MATCHES(cpu_backend(threads), kiln::ConfigError,
                         Catch::Matchers::Predicate<kiln::ConfigError>([&](const kiln::ConfigError& e) {
                           const std::string m = e.what();
                           return m.find("[device] threads = " + std::to_string(threads)) != std::string::npos &&
                                  m.find("at most") != std::string::npos && m.find("threads = 0") != std::string::npos;
                         }));
  }
  // 0 (one per core) and small counts still open.
  CHECK(cpu_backend(0)->open(0) != nullptr);
  CHECK(cpu_backend(2)->open(0) != nullptr);
}

TEST_CASE("a thread pool that cannot start its threads is a DeviceError, not std::terminate", "[hardening][threads]") {
  // As many threads as the backend allows (4 per core): more worker stacks than glibc's cache of freed stacks
  // could hold, so they need new mappings.
  cpu_set_t set;
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int threads = std::min(1024, 4 * CPU_COUNT(&set));
  auto backend = cpu_backend(threads);
  // In a child: an address-space limit just above what the process uses leaves no room for the workers' stacks.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t used = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    rlimit lim{used + (6u << 20), used + (6u << 20)};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(10);
    try {
      auto dev = backend->open(0);
      ::_exit(11);  // the threads started after all: the limit did not bite (checked below)
    } catch (const kiln::DeviceError& e) {
      const std::string m = e.what();
      ::_exit(m.find("[device] threads = " + std::to_string(threads)) != std::string::npos &&
                      m.find("worker thread") != std::string::npos
                  ? 0
                  : 12);
    } catch (...) {
      ::_exit(13);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));  // not killed by SIGABRT from std::terminate
  if (WEXITSTATUS(status) == 11)
    KILN_SKIP("the address-space limit did not stop thread creation on this host: the DeviceError is not reached");
  CHECK(WEXITSTATUS(status) == 0);
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

namespace {

// One convolution op (in0, in1 -> out) run on the device with its workspace, `times` times; the output.
Vec run_conv_op(Device& d, OpKind kind, const ConvAttrs& a, const Vec& in0, const Vec& in1, int times = 1) {
  const auto ar = op_arity(kind, a);
  Arena arena(d, {ar.in[0], ar.in[1], ar.out[0]});
  d.copy_from_host(in0.data(), arena.view(0));
  d.copy_from_host(in1.data(), arena.view(1));
  const Vec nan(static_cast<size_t>(ar.out[0]), NAN);
  d.copy_from_host(nan.data(), arena.view(2));
  OpCall c{kind, a, {arena.view(0), arena.view(1)}, {arena.view(2)}, {}};
  const size_t ws = d.workspace_bytes(c);
  Block* wb = ws ? d.allocate_block(ws) : nullptr;
  c.workspace = BufferView{wb, 0, ws};
  for (int i = 0; i < times; ++i) d.run(c);
  Vec out = read(d, arena.view(2));
  if (wb) d.free_block(wb);
  return out;
}

Vec reference_conv_op(OpKind kind, const ConvAttrs& a, const Vec& in0, const Vec& in1) {
  Vec out(static_cast<size_t>(op_arity(kind, a).out[0]));
  const float* ins[] = {in0.data(), in1.data()};
  float* outs[] = {out.data()};
  reference_op(kind, a, ins, outs);
  return out;
}

}  // namespace

TEST_CASE("cpu convolutions with same-width rows (one shifted copy per tap) equal the reference exactly", "[cpu]") {
  struct G {
    const char* name;
    ConvAttrs a;
  };
  const G geoms[] = {
      {"3x3x7x6.k4.r2.same", ConvAttrs{3, 3, 7, 6, 4, 2, 2, 1, 1, 0, 0, 7, 6}},
      {"2x3x6x7.k4.r4.same", ConvAttrs{2, 3, 6, 7, 4, 4, 4, 1, 1, 1, 1, 6, 7}},
      {"3x2x5x5.k3.r5x3.p2x1", ConvAttrs{3, 2, 5, 5, 3, 5, 3, 1, 1, 2, 1, 5, 5}},
      {"2x3x6x6.k2.r3.valid_h.same_w", ConvAttrs{2, 3, 6, 6, 2, 3, 3, 1, 1, 0, 1, 4, 6}},
      {"4x2x5x1.k3.r3.p1.one_column", ConvAttrs{4, 2, 5, 1, 3, 3, 3, 1, 1, 1, 1, 5, 1}},
      {"2x2x4x5.k3.r3x1.p2x0.tall_pad", ConvAttrs{2, 2, 4, 5, 3, 3, 1, 1, 1, 2, 0, 6, 5}},
  };
  for (int threads : {1, 2})
    for (const G& g : geoms)
      for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
        const std::string op(op_name(kind));
        CAPTURE(threads, g.name, op);
        auto cpu = open_cpu(threads);
        const auto ar = op_arity(kind, g.a);
        std::mt19937 gen(11);
        std::uniform_int_distribution<int> small(-3, 3);
        Vec in0(static_cast<size_t>(ar.in[0])), in1(static_cast<size_t>(ar.in[1]));
        for (float& v : in0) v = static_cast<float>(small(gen));
        for (float& v : in1) v = static_cast<float>(small(gen));
        const Vec want = reference_conv_op(kind, g.a, in0, in1);
        CHECK(run_conv_op(*cpu.device, kind, g.a, in0, in1) == want);
        CHECK(std::any_of(want.begin(), want.end(), [](float v) { return v != 0.f; }));
      }
}

namespace {

int64_t threads_of_this_process() {
  int64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

}  // namespace

// oneDNN (conv_dnnl.cpp) runs on the device's own threads: its OpenMP team must stay at one thread, both when a
// primitive is created (oneDNN fixes its thread partition then) and when it runs. Before that was held at creation,
// two OpenMP threads ran every convolution beside the pool's threads on a 2-core host. Checked here by counting the
// process's threads around convolutions that oneDNN runs (8 input channels), on a device of 2 threads.
TEST_CASE("cpu convolutions through oneDNN start no threads of their own", "[cpu]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev)");
#else
  auto cpu = open_cpu(2);
  const ConvAttrs a{6, 8, 10, 10, 16, 3, 3, 1, 1, 1, 1, 10, 10};
  const int64_t before = threads_of_this_process();
  std::mt19937 gen(3);
  for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
    const auto ar = op_arity(kind, a);
    const Vec in0 = random_vec(ar.in[0], gen), in1 = random_vec(ar.in[1], gen);
    CHECK(max_rel_diff(run_conv_op(*cpu.device, kind, a, in0, in1, 3), reference_conv_op(kind, a, in0, in1)) < 1e-5);
  }
  CHECK(threads_of_this_process() == before);
#endif
}

// [device] winograd (on by default): 3x3 stride-1 convolutions with 16..256 channels run through oneDNN's Winograd
// kernels where oneDNN has them for this CPU (AVX-512); their rounding differs from direct convolution's, within
// f32 accuracy. Both settings must give the reference result, each deterministically; with Winograd the workspace
// holds its scratchpad (several MiB), which is how this test sees that Winograd, not direct, ran.
TEST_CASE(
    "cpu 3x3 convolutions through oneDNN's Winograd kernels give the reference result, and winograd = false "
    "keeps direct convolution, exact on integers",
    "[cpu]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev)");
#else
  const ConvAttrs a{8, 16, 12, 12, 24, 3, 3, 1, 1, 1, 1, 12, 12};  // 4 images of 144 pixels per slice on 2 threads
  size_t ws[2][3] = {};
  for (int threads : {1, 2})
    for (bool wino : {true, false}) {
      auto cpu = open_cpu(threads, 1, 0, wino);
      std::mt19937 gen(5);
      int i = 0;
      for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
        const std::string op(op_name(kind));
        CAPTURE(threads, wino, op);
        const auto ar = op_arity(kind, a);
        const Vec in0 = random_vec(ar.in[0], gen), in1 = random_vec(ar.in[1], gen);
        const Vec got = run_conv_op(*cpu.device, kind, a, in0, in1);
        CHECK(max_rel_diff(got, reference_conv_op(kind, a, in0, in1)) < 1e-4);
        CHECK(run_conv_op(*cpu.device, kind, a, in0, in1) == got);
        if (!wino) {  // direct convolution sums small integers exactly, in any order (data/conformance: cpu.toml)
          std::uniform_int_distribution<int> small(-3, 3);
          Vec i0(in0.size()), i1(in1.size());
          for (float& v : i0) v = static_cast<float>(small(gen));
          for (float& v : i1) v = static_cast<float>(small(gen));
          CHECK(run_conv_op(*cpu.device, kind, a, i0, i1) == reference_conv_op(kind, a, i0, i1));
        }
        OpCall c{kind, a, {}, {}, {}};
        if (threads == 2) ws[wino ? 1 : 0][i++] = cpu.device->workspace_bytes(c);
      }
    }
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")))
    KILN_SKIP("oneDNN 2.x has Winograd kernels for AVX-512 CPUs only; this CPU ran direct convolution both ways");
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i, ws[0][i], ws[1][i]);
    CHECK(ws[1][i] > ws[0][i] + (size_t{1} << 20));
  }
#endif
}

// conv_dnnl.cpp cuts a batch into more slices than threads where a slice's images would pass 1 MiB, runs each
// thread's slices one after another and sums a thread's filter gradients slice by slice. 13 images of 16 x 64 x 48
// (192 KiB each, 5 per slice): 3 slices of 4, 4 and 5 images on 1 thread, 4 of 3, 3, 3 and 4 on 2 threads (two
// slice sizes, two per thread), 3 on 3 threads. Direct convolution sums integers exactly in any order, so every
// slice must be counted exactly once; Winograd, on random floats, within float tolerance.
TEST_CASE("cpu convolutions through oneDNN over more slices than threads equal the reference", "[cpu]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev)");
#else
  const ConvAttrs a{13, 16, 64, 48, 16, 3, 3, 1, 1, 1, 1, 64, 48};
  for (int threads : {1, 2, 3})
    for (bool wino : {false, true}) {
      auto cpu = open_cpu(threads, 1, 0, wino);
      std::mt19937 gen(17);
      std::uniform_int_distribution<int> small(-3, 3);
      for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
        const std::string op(op_name(kind));
        CAPTURE(threads, wino, op);
        const auto ar = op_arity(kind, a);
        Vec in0 = random_vec(ar.in[0], gen), in1 = random_vec(ar.in[1], gen);
        if (!wino) {  // integers for direct convolution, whose sums are then exact
          for (float& v : in0) v = static_cast<float>(small(gen));
          for (float& v : in1) v = static_cast<float>(small(gen));
        }
        const Vec want = reference_conv_op(kind, a, in0, in1), got = run_conv_op(*cpu.device, kind, a, in0, in1);
        if (wino)
          CHECK(max_rel_diff(got, want) < 1e-4);
        else
          CHECK(got == want);
        CHECK(run_conv_op(*cpu.device, kind, a, in0, in1) == got);
      }
    }
#endif
}

// Batch norm with the ReLU after it (fusion.cpp): forward, the normalization pass also writes the ReLU's output;
// backward, the ReLU's gradient is computed in the batch norm's statistics sweep. Both must leave every buffer as
// the two ops run one by one leave it, in place and with separate buffers, and stay unfused where they must.
