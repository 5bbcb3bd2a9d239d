// Throughput of the Vulkan backend's kernels (GEMM, convolutions, elementwise, reductions), with the CPU
// backend measured on the same shapes for comparison. Loads the plugins through the real PluginLoader.
//
//   kiln_vulkan_bench [--backends vulkan,cpu] [--only OP_PREFIX] [--target-gflop G] [--min-time S] [--best-of N]
//
// Prints a markdown table: op, shape, ms per op, GFLOP/s (or GB/s of buffer traffic for memory-bound ops), and how
// many ops over how long the figure is from.
//
// By default each figure is measured the way ggml's `test-backend-ops perf` measures (tests/test-backend-ops.cpp,
// eval_perf), so that bench/vulkan/compare_ggml.sh sets like against like: one warm-up call and wait, then timed
// batches of n = min(8191, G GFLOP / flops per op) + 1 back-to-back calls followed by one synchronize() (ggml's
// graph of n copies of the op and its one ggml_backend_graph_compute, which submits and waits), repeated until the
// timed batches add up to at least S seconds (defaults: G = 4, compare_ggml.sh's GGML_PERF_TARGET_GFLOP; S = 1,
// ggml's); the figure is total flops / total timed wall time, recording, submits and waits included. Memory-bound ops
// size their batches by bytes instead (G GiB of buffer traffic per batch, where ggml uses 32 GiB on a GPU: far too long
// for lavapipe). --best-of N reports the fastest single call (+ synchronize) of N instead: a lower bound on the time
// per op, not comparable to ggml's figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/plugin_loader.hpp"

using namespace kiln;

namespace {

struct Case {
  std::string op, shape;
  OpKind kind;
  OpAttrs attrs;
  double flops;  // per op; 0 for memory-bound ops (bytes are used instead)
};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int64_t s : {128, 256, 512, 1024, 2048}) {
    v.push_back({"gemm", std::to_string(s) + "^3", OpKind::Gemm, GemmAttrs{s, s, s}, 2.0 * s * s * s});
  }
  v.push_back({"gemm", "256x784x128 (dense fwd)", OpKind::Gemm, GemmAttrs{256, 128, 784}, 2.0 * 256 * 128 * 784});
  v.push_back({"gemm", "784x128x256 tn (dense dW)", OpKind::Gemm, GemmAttrs{784, 128, 256, true, false},
               2.0 * 784 * 128 * 256});
  ConvAttrs c;
  c.n = 32, c.c = 32, c.h = 32, c.w = 32, c.k = 64, c.r = 3, c.s = 3, c.pad_h = 1, c.pad_w = 1, c.oh = 32, c.ow = 32;
  const double conv_flops = 2.0 * c.n * c.k * c.oh * c.ow * c.c * c.r * c.s;
  const std::string cs = "32x32x32x32 k64 3x3 p1";
  v.push_back({"conv2d_forward", cs, OpKind::Conv2dForward, c, conv_flops});
  v.push_back({"conv2d_backward_data", cs, OpKind::Conv2dBackwardData, c, conv_flops});
  v.push_back({"conv2d_backward_filter", cs, OpKind::Conv2dBackwardFilter, c, conv_flops});
  v.push_back({"add", "16M", OpKind::Add, ElementwiseAttrs{1 << 24, 1.f, 1.f}, 0});
  v.push_back({"softmax_forward", "4096x1000", OpKind::SoftmaxForward, SoftmaxAttrs{4096, 1000}, 0});
  v.push_back({"reduce_sum", "1x16M x1", OpKind::ReduceSum, ReduceAttrs{1, 1 << 24, 1}, 0});
  v.push_back({"adam_update", "4M", OpKind::AdamUpdate, AdamAttrs{1 << 22}, 0});
  return v;
}

struct Result {
  double ms = 0, rate = 0;
  std::string unit, note, timed;  // timed: how the figure was measured ("B x N in S s", or "best of N")
};

struct Timing {
  double target_gflop = 4;  // compare_ggml.sh's GGML_PERF_TARGET_GFLOP default
  double min_seconds = 1;   // test-backend-ops perf: "run for at least 1 second"
  int best_of = 0;          // > 0: the fastest single call of this many instead
};

Result measure(Device& dev, Allocator& alloc, const Case& c, const Timing& t) {
  const OpArity ar = op_arity(c.kind, c.attrs);
  std::vector<Allocation> keep;
  OpCall call{c.kind, c.attrs, {}, {}, {}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  size_t bytes = 0;
  auto buffer = [&](int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    for (auto& x : host) x = u(rng);
    keep.push_back(alloc.allocate(host.size() * 4, {}));
    dev.copy_from_host(host.data(), keep.back().view());
    bytes += host.size() * 4;
    return keep.back().view();
  };
  for (int64_t n : ar.in) call.in.push_back(buffer(n));
  for (int64_t n : ar.out) call.out.push_back(buffer(n));
  if (size_t ws = dev.workspace_bytes(call)) {
    keep.push_back(alloc.allocate(ws, {}));
    call.workspace = keep.back().view();
  }
  Result r;
  if (const Support s = dev.supports(c.kind, c.attrs); !s.yes) {
    r.note = "unsupported: " + s.reason;
    return r;
  }
  dev.run(call);  // warm-up: pipelines, first-touch
  dev.synchronize();
  using clock = std::chrono::steady_clock;
  double seconds = 0;
  int64_t ops = 0;
  if (t.best_of > 0) {
    seconds = 1e30;
    for (int i = 0; i < t.best_of; ++i) {
      const auto t0 = clock::now();
      dev.run(call);
      dev.synchronize();
      seconds = std::min(seconds, std::chrono::duration<double>(clock::now() - t0).count());
    }
    ops = 1;
    r.timed = "best of " + std::to_string(t.best_of);
  } else {
    // ggml's n_runs: min(graph room, target / per op) + 1; its graph holds 8192 nodes, one of them the op.
    const double per_op = c.flops > 0 ? c.flops : double(bytes);
    const double target = c.flops > 0 ? t.target_gflop * 1e9 : t.target_gflop * double(1ull << 30);
    const int64_t batch = std::min<int64_t>(8191, static_cast<int64_t>(target / per_op)) + 1;
    int batches = 0;
    do {
      const auto t0 = clock::now();
      for (int64_t i = 0; i < batch; ++i) dev.run(call);
      dev.synchronize();
      seconds += std::chrono::duration<double>(clock::now() - t0).count();
      ops += batch;
      ++batches;
    } while (seconds < t.min_seconds);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%d x %lld in %.2f s", batches, static_cast<long long>(batch), seconds);
    r.timed = buf;
  }
  r.ms = seconds / double(ops) * 1e3;
  if (c.flops > 0) {
    r.rate = c.flops * double(ops) / seconds / 1e9;
    r.unit = "GFLOP/s";
  } else {
    r.rate = double(bytes) * double(ops) / seconds / 1e9;
    r.unit = "GB/s";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> backends = {"vulkan", "cpu"};
  Timing timing;
  std::string only;  // run only ops whose name starts with this
  const char* usage =
      "usage: kiln_vulkan_bench [--backends vulkan,cpu] [--only OP_PREFIX] [--target-gflop G] [--min-time S]\n"
      "                         [--best-of N]   (--repeat N: the old name of --best-of N)\n";
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--backends") && has_value) {
      backends.clear();
      std::stringstream ss(argv[++i]);
      for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
    } else if (!std::strcmp(argv[i], "--only") && has_value) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--target-gflop") && has_value) {
      timing.target_gflop = std::max(0.0, std::atof(argv[++i]));
    } else if (!std::strcmp(argv[i], "--min-time") && has_value) {
      timing.min_seconds = std::max(0.0, std::atof(argv[++i]));
    } else if ((!std::strcmp(argv[i], "--best-of") || !std::strcmp(argv[i], "--repeat")) && has_value) {
      timing.best_of = std::max(1, std::atoi(argv[++i]));
    } else {
      std::cerr << usage;
      return 2;
    }
  }
  Registry reg = Registry::with_builtins();
  PluginLoader loader;
  loader.load_dir(KILN_PLUGIN_DIR, reg);
  std::vector<std::unique_ptr<Backend>> owners;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Allocator>> allocs;
  for (const auto& b : backends) {
    owners.push_back(reg.backend(b)(BackendOptions{}));
    devices.push_back(owners.back()->open(0));
    allocs.push_back(std::make_unique<Allocator>(*devices.back(), AllocatorOptions{}));
    std::cout << "- " << b << ": " << devices.back()->info().name << "\n";
  }
  if (timing.best_of > 0) {
    std::cout << "- reported: the fastest single call (run + synchronize) of " << timing.best_of
              << " after a warm-up; NOT comparable to test-backend-ops perf, which reports total flops / total time\n";
  } else {
    std::cout << "- reported: as test-backend-ops perf: after a warm-up, batches of n = min(8191, "
              << timing.target_gflop
              << " GFLOP (GiB for GB/s rows) / per op) + 1 back-to-back calls and one synchronize, until at least "
              << timing.min_seconds
              << " s; rate = total flops (bytes) / total timed wall time, submits and waits included;"
                 " ms = that time / ops; timed = batches x n in seconds\n";
  }
  std::cout << "\n| op | shape |";
  for (const auto& b : backends) std::cout << ' ' << b << " ms | " << b << " rate | " << b << " timed |";
  std::cout << "\n|---|---|";
  for (size_t i = 0; i < backends.size(); ++i) std::cout << "---:|---:|---:|";
  std::cout << "\n";
  for (const Case& c : cases()) {
    if (c.op.rfind(only, 0) != 0) continue;
    std::cout << "| " << c.op << " | " << c.shape << " |";
    for (size_t i = 0; i < backends.size(); ++i) {
      const Result r = measure(*devices[i], *allocs[i], c, timing);
      char buf[160];
      if (r.note.empty())
        std::snprintf(buf, sizeof buf, " %.2f | %.2f %s | %s |", r.ms, r.rate, r.unit.c_str(), r.timed.c_str());
      else
        std::snprintf(buf, sizeof buf, " - | %s | - |", r.note.substr(0, 80).c_str());
      std::cout << buf << std::flush;
    }
    std::cout << "\n";
  }
  return 0;
}
