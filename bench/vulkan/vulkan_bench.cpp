// Throughput of the Vulkan backend's kernels (GEMM, convolutions, elementwise, reductions), with the CPU
// backend measured on the same shapes for comparison. Loads the plugins through the real PluginLoader.
//
//   kiln_vulkan_bench [--backends vulkan,cpu] [--repeat N] [--only OP_PREFIX]
//
// Prints a markdown table: op, shape, ms per op (best of N runs, each waited for), GFLOP/s (or GB/s of buffer
// traffic for memory-bound ops).
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
  std::string unit, note;
};

Result measure(Device& dev, Allocator& alloc, const Case& c, int repeat) {
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
  // Best of `repeat` timed runs (each run + synchronize): the machine is shared, the minimum is the stable figure.
  double s = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    dev.run(call);
    dev.synchronize();
    s = std::min(s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  r.ms = s * 1e3;
  if (c.flops > 0) {
    r.rate = c.flops / s / 1e9;
    r.unit = "GFLOP/s";
  } else {
    r.rate = double(bytes) / s / 1e9;
    r.unit = "GB/s";
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> backends = {"vulkan", "cpu"};
  int repeat = 5;
  std::string only;  // run only ops whose name starts with this
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--backends") && i + 1 < argc) {
      backends.clear();
      std::stringstream ss(argv[++i]);
      for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else {
      std::cerr << "usage: kiln_vulkan_bench [--backends vulkan,cpu] [--repeat N] [--only OP_PREFIX]\n";
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
  std::cout << "\n| op | shape |";
  for (const auto& b : backends) std::cout << ' ' << b << " ms | " << b << " rate |";
  std::cout << "\n|---|---|";
  for (size_t i = 0; i < backends.size(); ++i) std::cout << "---:|---:|";
  std::cout << "\n";
  for (const Case& c : cases()) {
    if (c.op.rfind(only, 0) != 0) continue;
    std::cout << "| " << c.op << " | " << c.shape << " |";
    for (size_t i = 0; i < backends.size(); ++i) {
      const Result r = measure(*devices[i], *allocs[i], c, repeat);
      char buf[96];
      if (r.note.empty())
        std::snprintf(buf, sizeof buf, " %.2f | %.1f %s |", r.ms, r.rate, r.unit.c_str());
      else
        std::snprintf(buf, sizeof buf, " - | %s |", r.note.substr(0, 80).c_str());
      std::cout << buf << std::flush;
    }
    std::cout << "\n";
  }
  return 0;
}
