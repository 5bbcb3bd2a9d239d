// CUDA backend throughput through Kiln's Device interface (the plugin loaded by the real PluginLoader):
//  1. GEMM TFLOP/s for square and training-shaped problems, exact FP32 and (with --tf32) TF32, or with
//     --dtype bfloat16|float16 on 16-bit operands and output (tensor cores, float32 accumulation: what a
//     [precision] compute = "bfloat16" layer's products run);
//  2. per-op overhead of a step of small ops run eagerly and replayed as a CUDA graph.
// usage: kiln_cuda_gemm_bench [--device N] [--iters N] [--tf32] [--dtype float32|bfloat16|float16]
//                             [--sizes 1024,2048,...]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/half.hpp"
#include "kiln/plugin.hpp"
#include "kiln/plugin_loader.hpp"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

struct Buf {
  Device& d;
  Block* b;
  size_t bytes;
  DType type;
  Buf(Device& dev, size_t n, DType t = DType::f32) : d(dev), b(dev.allocate_block(n)), bytes(n), type(t) {
    if (!b) throw std::runtime_error("out of device memory allocating " + std::to_string(n) + " bytes");
  }
  ~Buf() { d.free_block(b); }
  BufferView view() const { return {b, 0, bytes, type}; }
  // Every element `value`, stored as the buffer's type.
  void fill(float value) {
    const size_t n = type == DType::f32 ? bytes / 4 : bytes / 2;
    std::vector<float> f(n, value);
    std::vector<unsigned char> raw(bytes);
    if (type == DType::f32)
      std::memcpy(raw.data(), f.data(), bytes);
    else
      from_float(f.data(), raw.data(), type, n);
    d.copy_from_host(raw.data(), view());
  }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void bench_gemm(Device& d, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int iters, DType type) {
  Buf a(d, storage_bytes(m * k, type), type), b(d, storage_bytes(k * n, type), type),
      y(d, storage_bytes(m * n, type), type);
  a.fill(0.5f);
  b.fill(0.5f);
  OpCall c{OpKind::Gemm, GemmAttrs{m, n, k, ta, tb, 1.f, 0.f}, {a.view(), b.view()}, {y.view()}, {}};
  const size_t ws_bytes = d.workspace_bytes(c);
  std::unique_ptr<Buf> ws;
  if (ws_bytes) {
    ws = std::make_unique<Buf>(d, ws_bytes);
    c.workspace = ws->view();
  }
  for (int i = 0; i < 3; ++i) d.run(c);
  d.synchronize();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) d.run(c);
  d.synchronize();
  const double t = seconds_since(t0) / iters;
  std::printf("  gemm m=%-6lld n=%-6lld k=%-6lld %s%s  %9.3f ms  %7.2f TFLOP/s\n", (long long)m, (long long)n,
              (long long)k, ta ? "T" : "N", tb ? "T" : "N", t * 1e3, 2.0 * m * n * k / t / 1e12);
}

// A step of `ops` tiny elementwise ops: with no real work, its time is the per-op launch cost.
void bench_launch(Device& d, int ops, int steps, bool graphs) {
  Buf x(d, 4096), y(d, 4096);
  std::vector<OpCall> calls;
  for (int i = 0; i < ops; ++i)
    calls.push_back({i % 2 ? OpKind::Scale : OpKind::Add,
                     ElementwiseAttrs{1024, 1.f, 0.5f},
                     i % 2 ? std::vector<BufferView>{x.view()} : std::vector<BufferView>{x.view(), y.view()},
                     {y.view()},
                     {}});
  auto step = [&] {
    if (graphs) d.begin_sequence(1);
    for (const auto& c : calls) d.run(c);
    if (graphs) d.end_sequence();
    d.synchronize();
  };
  for (int i = 0; i < 3; ++i) step();  // eager, capture, first replay
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double t = seconds_since(t0) / steps;
  std::printf("  %d small ops per step, %-12s %8.3f ms/step  %6.2f us/op\n", ops, graphs ? "CUDA graph" : "eager",
              t * 1e3, t * 1e6 / ops);
}

std::vector<int64_t> parse_sizes(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoll(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0, iters = 20;
  bool tf32 = false;
  DType dtype = DType::f32;
  std::vector<int64_t> sizes = {1024, 2048, 4096, 8192};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc)
      device = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (a == "--tf32")
      tf32 = true;
    else if (a == "--dtype" && i + 1 < argc &&
             (std::strcmp(argv[i + 1], "float32") == 0 || std::strcmp(argv[i + 1], "bfloat16") == 0 ||
              std::strcmp(argv[i + 1], "float16") == 0)) {
      const std::string t = argv[++i];
      dtype = t == "bfloat16" ? DType::bf16 : t == "float16" ? DType::f16 : DType::f32;
    } else if (a == "--sizes" && i + 1 < argc)
      sizes = parse_sizes(argv[++i]);
    else {
      std::cerr << "usage: kiln_cuda_gemm_bench [--device N] [--iters N] [--tf32] [--dtype float32|bfloat16|float16] "
                   "[--sizes 1024,2048,...]\n";
      return 2;
    }
  }
  if (tf32) setenv("KILN_CUDA_TF32", "1", 1);  // read when the device opens
  try {
    PluginLoader loader;
    Registry reg = Registry::with_builtins();
    loader.load_dir(KILN_PLUGIN_DIR, reg);
    if (!reg.has_backend("cuda")) {
      std::cerr << "kiln_cuda_gemm_bench: the cuda plugin did not load from " << KILN_PLUGIN_DIR << "\n";
      return 1;
    }
    auto backend = reg.backend("cuda")(BackendOptions{});
    if (backend->enumerate().empty()) {
      std::cerr << "kiln_cuda_gemm_bench: no CUDA device: " << backend->unavailable_reason() << "\n";
      return 1;
    }
    auto d = backend->open(device);
    if (dtype != DType::f32) {
      if (const Support s = d->supports_dtype(dtype); !s.yes) {
        std::cerr << "kiln_cuda_gemm_bench: " << s.reason << "\n";
        return 1;
      }
      std::printf("%s, %s operands and output, FP32 accumulation\n", d->info().name.c_str(), dtype_name(dtype));
    } else {
      std::printf("%s, %s math\n", d->info().name.c_str(), tf32 ? "TF32" : "FP32");
    }
    for (int64_t s : sizes) bench_gemm(*d, s, s, s, false, false, iters, dtype);
    std::printf("training-shaped (dense 4096x4096 at batch 256: forward, data grad, weight grad):\n");
    bench_gemm(*d, 256, 4096, 4096, false, false, iters * 5, dtype);
    bench_gemm(*d, 256, 4096, 4096, false, true, iters * 5, dtype);
    bench_gemm(*d, 4096, 4096, 256, true, false, iters * 5, dtype);
    if (dtype != DType::f32) return 0;  // the launch overhead does not depend on the storage type
    std::printf("launch overhead:\n");
    bench_launch(*d, 200, 50, false);
    bench_launch(*d, 200, 50, true);
    std::printf("%s\n", static_cast<const char*>(d->extension("cuda.graph_report")));
  } catch (const std::exception& e) {
    std::cerr << "kiln_cuda_gemm_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
