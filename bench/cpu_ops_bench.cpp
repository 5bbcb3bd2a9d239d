// GEMM and convolution kernels of the "cpu" plugin, through the real Device API, in GFLOP/s and ms.
//   kiln_cpu_ops_bench [--threads N] [--plugin-dir DIR] [--reps N] [--conv-only] [--no-winograd]
// Also measures the two design choices of the plugin's threading:
//  - on an MLP-shaped op sequence, (A) the plugin's way, OpenBLAS single-threaded inside the plugin's
//    threads, against (B) OpenBLAS's own pthreads for the GEMMs next to the plugin's other kernels;
//  - handing 2 chunks of busy work to 2 threads: the plugin's ThreadPool against an OpenMP parallel for (when
//    built with OpenMP, KILN_BENCH_OPENMP; otherwise the pool alone).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/plugin_loader.hpp"
#include "thread_pool.hpp"

using namespace kiln;

namespace {

// Buffers for one benchmark, all in one device block.
struct Buffers {
  Device& dev;
  Block* block = nullptr;
  std::vector<BufferView> views;
  Buffers(Device& d, const std::vector<int64_t>& floats) : dev(d) {
    size_t total = 0;
    std::vector<size_t> offs;
    for (int64_t f : floats) {
      offs.push_back(total);
      total += (static_cast<size_t>(f) * 4 + 255) / 256 * 256;
    }
    block = dev.allocate_block(std::max<size_t>(total, 256));
    std::mt19937 g(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < floats.size(); ++i) {
      views.push_back(BufferView{block, offs[i], static_cast<size_t>(floats[i]) * 4});
      float* p = views.back().host();
      for (int64_t j = 0; j < floats[i]; ++j) p[j] = u(g);
    }
  }
  ~Buffers() { dev.free_block(block); }
};

// Best-of-reps wall time of f, in seconds, after one warm-up call.
double best_time(int reps, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

OpCall call_for(Device& dev, OpKind k, OpAttrs a, const Buffers& b, std::vector<int> in, std::vector<int> out,
                Block*& ws_block) {
  OpCall c;
  c.kind = k;
  c.attrs = std::move(a);
  for (int i : in) c.in.push_back(b.views[size_t(i)]);
  for (int o : out) c.out.push_back(b.views[size_t(o)]);
  const size_t ws = dev.workspace_bytes(c);
  if (ws) {
    ws_block = dev.allocate_block(ws);
    c.workspace = BufferView{ws_block, 0, ws};
  }
  return c;
}

void bench_gemm(Device& dev, int reps) {
  std::printf("\nGEMM (sgemm split over the device's threads)\n%-28s %10s %10s\n", "m x n x k", "ms", "GFLOP/s");
  struct G {
    int64_t m, n, k;
    bool ta, tb;
  };
  for (G g : {G{32, 256, 784, false, false}, G{128, 256, 784, false, false}, G{784, 256, 128, true, false},
              G{128, 784, 256, false, true}, G{128, 256, 256, false, false}, G{64, 128, 3136, false, false},
              G{1024, 1024, 1024, false, false}}) {
    Buffers b(dev, {g.m * g.k, g.k * g.n, g.m * g.n});
    Block* ws = nullptr;
    OpCall c = call_for(dev, OpKind::Gemm, GemmAttrs{g.m, g.n, g.k, g.ta, g.tb}, b, {0, 1}, {2}, ws);
    const double t = best_time(reps, [&] { dev.run(c); });
    char name[64];
    std::snprintf(name, sizeof name, "%lldx%lldx%lld%s%s", (long long)g.m, (long long)g.n, (long long)g.k,
                  g.ta ? " tA" : "", g.tb ? " tB" : "");
    std::printf("%-28s %10.3f %10.1f\n", name, t * 1e3, 2.0 * g.m * g.n * g.k / t / 1e9);
  }
}

// Attention's batched products at nanoGPT's shakespeare_char shapes (batch 12 x 4 heads, T = 64, D = 32): the
// batched_gemm op against a plain loop of 48 single-threaded sgemm calls on the calling thread.
void bench_batched_gemm(Device& dev, int reps) {
  std::printf("\nbatched_gemm, nanoGPT attention (48 heads, T 64, D 32)\n%-34s %10s %10s %12s\n", "product", "ms",
              "GFLOP/s", "loop ms");
  struct G {
    const char* name;
    int64_t m, n, k;
    bool ta, tb;
  };
  const int64_t batch = 48;
  for (G g : {G{"scores q k^T", 64, 64, 32, false, true}, G{"y = att v", 64, 32, 64, false, false},
              G{"d att = dy v^T", 64, 64, 32, false, true}, G{"d v = att^T dy", 64, 32, 64, true, false},
              G{"d q = d s k", 64, 32, 64, false, false}, G{"d k = d s^T q", 64, 32, 64, true, false}}) {
    Buffers b(dev, {batch * g.m * g.k, batch * g.k * g.n, batch * g.m * g.n});
    Block* ws = nullptr;
    OpCall c =
        call_for(dev, OpKind::BatchedGemm, GemmAttrs{g.m, g.n, g.k, g.ta, g.tb, 1.f, 0.f, batch}, b, {0, 1}, {2}, ws);
    const double t = best_time(reps, [&] { dev.run(c); });
    const float* A = b.views[0].host();
    const float* B = b.views[1].host();
    float* Y = b.views[2].host();
    const double loop = best_time(reps, [&] {
      for (int64_t i = 0; i < batch; ++i)
        cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, int(g.m),
                    int(g.n), int(g.k), 1.f, A + i * g.m * g.k, int(g.ta ? g.m : g.k), B + i * g.k * g.n,
                    int(g.tb ? g.k : g.n), 0.f, Y + i * g.m * g.n, int(g.n));
    });
    std::printf("%-34s %10.4f %10.1f %12.4f\n", g.name, t * 1e3, 2.0 * batch * g.m * g.n * g.k / t / 1e9, loop * 1e3);
  }
}

void bench_conv(Device& dev, int reps) {
  std::printf("\nConvolutions of the Fashion-MNIST CNN (batch 64) and ResNet (batch 128)\n%-40s %10s %10s\n",
              "layer / pass", "ms", "GFLOP/s");
  struct L {
    const char* name;
    ConvAttrs a;
  };
  for (L l : {L{"conv1 1->32 3x3 same 28x28", {64, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 28, 28}},
              L{"conv2 32->64 3x3 same 14x14", {64, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14}},
              L{"conv 64->64 1x1 14x14", {64, 64, 14, 14, 64, 1, 1, 1, 1, 0, 0, 14, 14}},
              L{"resnet 16->16 3x3 same 28x28", {128, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 28, 28}},
              L{"resnet 16->32 3x3 /2 28x28", {128, 16, 28, 28, 32, 3, 3, 2, 2, 0, 0, 14, 14}},
              L{"resnet 32->32 3x3 same 14x14", {128, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 14, 14}},
              L{"resnet 64->64 3x3 same 7x7", {128, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1, 7, 7}}}) {
    const ConvAttrs& a = l.a;
    const int64_t x = a.n * a.c * a.h * a.w, w = a.k * a.c * a.r * a.s, y = a.n * a.k * a.oh * a.ow;
    const double flops = 2.0 * a.n * a.k * a.oh * a.ow * a.c * a.r * a.s;
    Buffers b(dev, {x, w, y});
    const char* pass[] = {"forward", "backward data", "backward filter"};
    const OpKind kinds[] = {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter};
    const std::vector<int> ins[] = {{0, 1}, {2, 1}, {0, 2}};
    const int outs[] = {2, 0, 1};
    for (int p = 0; p < 3; ++p) {
      Block* ws = nullptr;
      OpCall c = call_for(dev, kinds[p], a, b, ins[p], {outs[p]}, ws);
      const double t = best_time(reps, [&] { dev.run(c); });
      std::printf("%-40s %10.3f %10.1f\n", (std::string(l.name) + " " + pass[p]).c_str(), t * 1e3, flops / t / 1e9);
      if (ws) dev.free_block(ws);
    }
  }
}

// Every op of the Fashion-MNIST CNN's training step at batch 64, timed one by one (best of reps), with
// fresh random buffers sized by op_arity. Prints each op and the sum.
void bench_cnn_ops(Device& dev, int reps) {
  const int64_t n = 64;
  const ConvAttrs c1{n, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 28, 28}, c2{n, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14};
  const PoolAttrs p1{n, 32, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14}, p2{n, 64, 14, 14, 2, 2, 2, 2, 0, 0, 7, 7};
  struct Op {
    const char* name;
    OpKind kind;
    OpAttrs attrs;
  };
  const std::vector<Op> ops = {
      {"conv1 forward", OpKind::Conv2dForward, c1},
      {"conv1 bias", OpKind::BiasAdd, BiasAttrs{n, 32, 784}},
      {"conv1 relu", OpKind::ActivationForward, ActivationAttrs{Activation::relu, n * 32 * 784}},
      {"pool1 forward", OpKind::MaxPoolForward, p1},
      {"conv2 forward", OpKind::Conv2dForward, c2},
      {"conv2 bias", OpKind::BiasAdd, BiasAttrs{n, 64, 196}},
      {"conv2 relu", OpKind::ActivationForward, ActivationAttrs{Activation::relu, n * 64 * 196}},
      {"pool2 forward", OpKind::MaxPoolForward, p2},
      {"dense1 gemm", OpKind::Gemm, GemmAttrs{n, 128, 3136}},
      {"dense1 bias+relu", OpKind::BiasAdd, BiasAttrs{n, 128, 1}},
      {"dense2 gemm", OpKind::Gemm, GemmAttrs{n, 10, 128}},
      {"softmax xent", OpKind::SoftmaxCrossEntropy, LossAttrs{n, 10, 1.f / n}},
      {"dense2 dW", OpKind::Gemm, GemmAttrs{128, 10, n, true, false}},
      {"dense2 dx", OpKind::Gemm, GemmAttrs{n, 128, 10, false, true}},
      {"dense1 relu backward", OpKind::ActivationBackward, ActivationAttrs{Activation::relu, n * 128}},
      {"dense1 dW", OpKind::Gemm, GemmAttrs{3136, 128, n, true, false}},
      {"dense1 db", OpKind::BiasGrad, BiasAttrs{n, 128, 1}},
      {"dense1 dx", OpKind::Gemm, GemmAttrs{n, 3136, 128, false, true}},
      {"pool2 backward", OpKind::MaxPoolBackward, p2},
      {"conv2 relu backward", OpKind::ActivationBackward, ActivationAttrs{Activation::relu, n * 64 * 196}},
      {"conv2 db", OpKind::BiasGrad, BiasAttrs{n, 64, 196}},
      {"conv2 backward filter", OpKind::Conv2dBackwardFilter, c2},
      {"conv2 backward data", OpKind::Conv2dBackwardData, c2},
      {"pool1 backward", OpKind::MaxPoolBackward, p1},
      {"conv1 relu backward", OpKind::ActivationBackward, ActivationAttrs{Activation::relu, n * 32 * 784}},
      {"conv1 db", OpKind::BiasGrad, BiasAttrs{n, 32, 784}},
      {"conv1 backward filter", OpKind::Conv2dBackwardFilter, c1},
      {"adam dense1 kernel", OpKind::AdamUpdate, AdamAttrs{3136 * 128}},
      {"adam conv2 kernel", OpKind::AdamUpdate, AdamAttrs{64 * 32 * 9}},
  };
  std::printf("\nCNN training step ops, batch 64 (each timed alone)\n%-24s %10s\n", "op", "ms");
  double total = 0;
  for (const auto& op : ops) {
    const OpArity ar = op_arity(op.kind, op.attrs);
    std::vector<int64_t> sizes(ar.in.begin(), ar.in.end());
    sizes.insert(sizes.end(), ar.out.begin(), ar.out.end());
    Buffers b(dev, sizes);
    std::vector<int> in, out;
    for (size_t i = 0; i < ar.in.size(); ++i) in.push_back(int(i));
    for (size_t o = 0; o < ar.out.size(); ++o) out.push_back(int(ar.in.size() + o));
    if (op.kind == OpKind::AdamUpdate)  // v must be >= 0
      for (float *p = b.views[3].host(), *e = p + ar.out[2]; p < e; ++p) *p = *p < 0 ? -*p : *p;
    if (op.kind == OpKind::MaxPoolBackward) {  // realistic input: after a ReLU (many ties at 0), y = pool(x)
      for (float *p = b.views[0].host(), *e = p + ar.in[0]; p < e; ++p) *p = *p < 0 ? 0 : *p;
      dev.run(OpCall{OpKind::MaxPoolForward, op.attrs, {b.views[0]}, {b.views[1]}, {}});
    }
    Block* ws = nullptr;
    OpCall c = call_for(dev, op.kind, op.attrs, b, in, out, ws);
    const double t = best_time(reps, [&] { dev.run(c); });
    if (ws) dev.free_block(ws);
    total += t;
    std::printf("%-24s %10.3f\n", op.name, t * 1e3);
  }
  std::printf("%-24s %10.3f\n", "sum", total * 1e3);
}

// An MLP 784-256-256-10 step's ops at batch n (gemms, bias, relu, their backward, Adam), run as calls.
// `direct_blas` runs the GEMMs with cblas_sgemm on OpenBLAS's own threads instead of through the device.
double mlp_step(Device& dev, int64_t n, bool direct_blas, int reps) {
  const int64_t d[] = {784, 256, 256, 10};
  // buffers: x, then per layer: W, b, y(pre), h(post), dW, db, dy, dh, m/v for W and b
  std::vector<int64_t> sizes{n * d[0]};
  for (int l = 0; l < 3; ++l) {
    const int64_t wi = d[l] * d[l + 1], o = n * d[l + 1];
    for (int64_t s : {wi, d[l + 1], o, o, wi, d[l + 1], o, o, wi, wi, d[l + 1], d[l + 1]}) sizes.push_back(s);
  }
  Buffers b(dev, sizes);
  auto W = [](int l) { return 1 + 12 * l; };
  std::vector<OpCall> calls;
  auto add = [&](OpKind k, OpAttrs a, std::vector<int> in, std::vector<int> out) {
    Block* ws = nullptr;
    calls.push_back(call_for(dev, k, std::move(a), b, std::move(in), std::move(out), ws));
  };
  for (int l = 0; l < 3; ++l) {  // forward
    const int in = l == 0 ? 0 : W(l - 1) + 3;
    add(OpKind::Gemm, GemmAttrs{n, d[l + 1], d[l]}, {in, W(l)}, {W(l) + 2});
    add(OpKind::BiasAdd, BiasAttrs{n, d[l + 1], 1}, {W(l) + 2, W(l) + 1}, {W(l) + 2});
    if (l < 2) add(OpKind::ActivationForward, ActivationAttrs{Activation::relu, n * d[l + 1]}, {W(l) + 2}, {W(l) + 3});
  }
  for (int l = 2; l >= 0; --l) {  // backward: dy of layer l lives at W(l)+6
    const int in = l == 0 ? 0 : W(l - 1) + 3;
    add(OpKind::Gemm, GemmAttrs{d[l], d[l + 1], n, true, false}, {in, W(l) + 6}, {W(l) + 4});
    add(OpKind::BiasGrad, BiasAttrs{n, d[l + 1], 1}, {W(l) + 6}, {W(l) + 5});
    if (l > 0) {
      add(OpKind::Gemm, GemmAttrs{n, d[l], d[l + 1], false, true}, {W(l) + 6, W(l)}, {W(l - 1) + 7});
      add(OpKind::ActivationBackward, ActivationAttrs{Activation::relu, n * d[l]}, {W(l - 1) + 3, W(l - 1) + 7},
          {W(l - 1) + 6});
    }
  }
  for (int l = 0; l < 3; ++l) {
    add(OpKind::AdamUpdate, AdamAttrs{d[l] * d[l + 1]}, {W(l) + 4}, {W(l), W(l) + 8, W(l) + 9});
    add(OpKind::AdamUpdate, AdamAttrs{d[l + 1]}, {W(l) + 5}, {W(l) + 1, W(l) + 10, W(l) + 11});
  }
  auto step = [&] {
    for (const auto& c : calls) {
      if (direct_blas && c.kind == OpKind::Gemm) {
        const auto& a = std::get<GemmAttrs>(c.attrs);
        cblas_sgemm(CblasRowMajor, a.trans_a ? CblasTrans : CblasNoTrans, a.trans_b ? CblasTrans : CblasNoTrans,
                    int(a.m), int(a.n), int(a.k), a.alpha, c.in[0].host(), int(a.trans_a ? a.m : a.k), c.in[1].host(),
                    int(a.trans_b ? a.k : a.n), a.beta, c.out[0].host(), int(a.n));
      } else {
        dev.run(c);
      }
    }
  };
  // Median of reps, since contention shows up as a heavy tail rather than in the best case.
  step();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device::run on tiny ops: the fixed cost of one call (checks, dispatch), in ns.
void bench_call_overhead(Device& dev) {
  Buffers b(dev, {16, 16, 16});
  std::printf("\nPer-call overhead (16-element ops, ns per Device::run)\n");
  const std::pair<const char*, OpCall> calls[] = {
      {"fill", OpCall{OpKind::Fill, ElementwiseAttrs{16, 1.f}, {}, {b.views[2]}, {}}},
      {"add", OpCall{OpKind::Add, ElementwiseAttrs{16}, {b.views[0], b.views[1]}, {b.views[2]}, {}}},
      {"gemm 4x4x4", OpCall{OpKind::Gemm, GemmAttrs{4, 4, 4}, {b.views[0], b.views[1]}, {b.views[2]}, {}}}};
  for (const auto& [name, c] : calls) {
    const int n = 200000;
    const double t = best_time(3, [&] {
      for (int i = 0; i < n; ++i) dev.run(c);
    });
    std::printf("%-12s %8.0f\n", name, t / n * 1e9);
  }
}

// Per call of 2 chunks x `us` microseconds of spinning, ThreadPool vs OpenMP: the cost of handing work to a
// second thread, which is what matters for the short ops of a training step (and on a busy host, whether a
// late thread stalls the call).
void bench_handoff(int calls) {
  auto busy = [](double us) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < us) {
    }
  };
  std::printf("\nHanding 2 chunks to 2 threads (us per call; ideal = chunk)\n%-10s %12s %12s\n", "chunk us",
              "ThreadPool", "OpenMP for");
  cpu::ThreadPool pool(2);
  // Idle gaps so that neither side's threads are still spinning from the other's last call.
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  for (double us : {5.0, 20.0, 70.0, 300.0}) {
    settle();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) pool.run(2, [&](int64_t, int) { busy(us); });
    const double tp = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
#ifdef KILN_BENCH_OPENMP
    settle();
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
#pragma omp parallel for num_threads(2)
      for (int c = 0; c < 2; ++c) busy(us);
    }
    const double om = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    std::printf("%-10.0f %12.1f %12.1f\n", us, tp, om);
#else
    std::printf("%-10.0f %12.1f %12s\n", us, tp, "(no OpenMP)");
#endif
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, reps = 20;
  std::string dir;
  bool conv_only = false, winograd = true;
  for (int i = 1; i < argc; ++i) {  // flags and "--key value" pairs in any order
    const std::string k = argv[i];
    const bool has_value = i + 1 < argc;
    if (k == "--conv-only")
      conv_only = true;
    else if (k == "--no-winograd")
      winograd = false;
    else if (k == "--threads" && has_value)
      threads = std::stoi(argv[++i]);
    else if (k == "--plugin-dir" && has_value)
      dir = argv[++i];
    else if (k == "--reps" && has_value)
      reps = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "kiln_cpu_ops_bench: unknown or incomplete argument '%s'\n", k.c_str());
      return 2;
    }
  }
  try {
    bench_handoff(reps * 100);  // first: no other threads of this process are alive yet
    PluginLoader loader;
    Registry reg = Registry::with_builtins();
    if (!dir.empty())
      loader.load_dir(dir, reg);
    else
      for (auto& d : PluginLoader::default_dirs()) loader.load_dir(d, reg);
    auto backend = reg.backend("cpu")(
        BackendOptions::parse("threads = " + std::to_string(threads) + (winograd ? "" : "\nwinograd = false")));
    auto dev = backend->open(0);
    std::printf("device: %s\n", dev->info().name.c_str());
    if (conv_only) {  // --conv-only: the convolution table alone
      bench_conv(*dev, std::max(3, reps / 4));
      return 0;
    }
    bench_call_overhead(*dev);
    bench_gemm(*dev, reps);
    bench_batched_gemm(*dev, reps);
    bench_conv(*dev, std::max(3, reps / 4));
    bench_cnn_ops(*dev, std::max(3, reps / 4));
    std::printf("\nMLP 784-256-256-10 step ops (median ms)\n%-8s %26s %26s\n", "batch", "A: OpenBLAS 1t per thread",
                "B: OpenBLAS's own pthreads");
    for (int64_t n : {32, 128}) {
      openblas_set_num_threads(1);
      const double a = mlp_step(*dev, n, false, reps * 10);
      openblas_set_num_threads(std::max(1, threads == 0 ? 2 : threads));
      const double b = mlp_step(*dev, n, true, reps * 10);
      openblas_set_num_threads(1);
      std::printf("%-8lld %26.3f %26.3f\n", (long long)n, a * 1e3, b * 1e3);
    }

  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_ops_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
