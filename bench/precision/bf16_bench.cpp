// What bfloat16 can buy on this CPU, before Kiln computes in it: `kiln_bf16_bench [seconds]`.
//  1. Peaks: chains of 512-bit FP32 FMAs (16 lanes x 2 FLOP = 32 FLOP an instruction) and of AVX512_BF16 dot products
//     (vdpbf16ps: 16 FP32 lanes, each adding two bf16 products = 64 FLOP an instruction), on 1 thread and on every
//     hardware thread, twelve independent accumulators per thread so that the issue rate, not the latency, bounds them.
//  2. oneDNN's matmul (the library Kiln's CPU backend runs its convolutions on) at the shapes of Kiln's GEMM-bound
//     steps, FP32 against bf16 inputs with FP32 accumulation and output, on every thread; ONEDNN_VERBOSE=1 in the
//     environment prints the implementation oneDNN picks (avx512_core_bf16 is the one with vdpbf16ps).
// The ratio of the two peaks bounds what bf16 can gain in a compute-bound product; the matmul rows show how much of it
// oneDNN reaches. bench/results/precision.md holds the figures and the command.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

__attribute__((target("avx512f"), noinline)) float fp32_loop(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];  // keeps the loop alive
}

__attribute__((target("avx512f,avx512bf16"), noinline)) float bf16_loop(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];  // keeps the loop alive
}

// Best of 5 runs of `threads` threads, each `iters` iterations of `loop`; GFLOP/s over all threads.
double peak(const std::function<float(int64_t)>& loop, double flop_per_iter, int threads, int64_t iters) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    std::vector<float> sink(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) {
        }
        sink[static_cast<size_t>(t)] = loop(iters);
      });
    while (ready.load() < threads) {
    }
    const auto t0 = Clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    const double gf = static_cast<double>(threads) * static_cast<double>(iters) * flop_per_iter / since(t0) / 1e9;
    if (gf > best) best = gf;
    if (sink[0] == 12345.f) std::puts("");
  }
  return best;
}

// Iterations of `loop` that take about `seconds` on one thread.
int64_t calibrate(const std::function<float(int64_t)>& loop, double seconds) {
  for (int64_t iters = 1 << 16;; iters *= 2) {
    const auto t0 = Clock::now();
    volatile float s = loop(iters);
    (void)s;
    const double el = since(t0);
    if (el > seconds / 4 || iters > (int64_t{1} << 40))
      return static_cast<int64_t>(static_cast<double>(iters) * seconds / el);
  }
}

// oneDNN matmul (m x k) x (k x n) -> (m x n) FP32, the inputs in `in`: best GFLOP/s over `seconds`.
double matmul(dnnl::engine& eng, dnnl::stream& st, int64_t m, int64_t k, int64_t n, dnnl::memory::data_type in,
              double seconds) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::memory::desc a({m, k}, in, tag::ab), b({k, n}, in, tag::ab), c({m, n}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);  // oneDNN 2.x (Debian 12: 2.7)
  dnnl::memory ma(a, eng), mb(b, eng), mc(c, eng);
  // Small values, so that no product overflows (their size does not change the time).
  auto fill = [](dnnl::memory& mem) {
    const size_t bytes = mem.get_desc().get_size();
    std::memset(mem.get_data_handle(), 0x3c, bytes);
  };
  fill(ma);
  fill(mb);
  dnnl::matmul mm(pd);
  const std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
  mm.execute(st, args);
  st.wait();
  double best = 0;
  const auto start = Clock::now();
  while (since(start) < seconds) {
    const auto t0 = Clock::now();
    mm.execute(st, args);
    st.wait();
    const double gf = 2.0 * static_cast<double>(m * k * n) / since(t0) / 1e9;
    if (gf > best) best = gf;
  }
  return best;
}

// A 3x3 convolution, stride 1, padding 1 (n, c, h, w) -> (n, k, h, w), in oneDNN's preferred layouts (format "any"):
// the forward pass, the backward pass to the data and to the weights, inputs of type `in`, outputs fp32. Best
// GFLOP/s of each over `seconds` (2 n k c h w 9 FLOP each).
struct ConvRates {
  double fwd = 0, bwd_data = 0, bwd_weights = 0;
};

ConvRates conv3x3(dnnl::engine& eng, dnnl::stream& st, int64_t n, int64_t c, int64_t k, int64_t hw,
                  dnnl::memory::data_type in, double seconds) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using namespace dnnl;
  const memory::dims src_d{n, c, hw, hw}, wei_d{k, c, 3, 3}, dst_d{n, k, hw, hw}, strides{1, 1}, pad{1, 1};
  memory::desc src(src_d, in, tag::any), wei(wei_d, in, tag::any), dst(dst_d, dt::f32, tag::any);
  convolution_forward::primitive_desc fpd(
      convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, src, wei, dst, strides, pad,
                                pad),
      eng);
  // Backward to the data: dy in `in`, dx fp32; to the weights: x and dy in `in`, dw fp32.
  memory::desc dy(dst_d, in, tag::any), dx(src_d, dt::f32, tag::any), dw(wei_d, dt::f32, tag::any);
  convolution_backward_data::primitive_desc dpd(
      convolution_backward_data::desc(algorithm::convolution_direct, dx, wei, dy, strides, pad, pad), eng, fpd);
  convolution_backward_weights::primitive_desc wpd(
      convolution_backward_weights::desc(algorithm::convolution_direct, src, dw, dy, strides, pad, pad), eng, fpd);
  auto filled = [&](const memory::desc& d) {
    memory m(d, eng);
    std::memset(m.get_data_handle(), 0x3c, d.get_size());
    return m;
  };
  memory x = filled(fpd.src_desc()), w = filled(fpd.weights_desc()), y = filled(fpd.dst_desc());
  memory gy = filled(dpd.diff_dst_desc()), gx = filled(dpd.diff_src_desc()), gw = filled(wpd.diff_weights_desc());
  memory gy_w = filled(wpd.diff_dst_desc()), x_w = filled(wpd.src_desc()), w_d = filled(dpd.weights_desc());
  const double flop = 2.0 * static_cast<double>(n * k * c * hw * hw * 9);
  auto best = [&](primitive p, const std::unordered_map<int, memory>& args) {
    p.execute(st, args);
    st.wait();
    double b = 0;
    for (const auto start = Clock::now(); since(start) < seconds;) {
      const auto t0 = Clock::now();
      p.execute(st, args);
      st.wait();
      b = std::max(b, flop / since(t0) / 1e9);
    }
    return b;
  };
  ConvRates r;
  r.fwd = best(convolution_forward(fpd), {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
  r.bwd_data =
      best(convolution_backward_data(dpd), {{DNNL_ARG_DIFF_DST, gy}, {DNNL_ARG_WEIGHTS, w_d}, {DNNL_ARG_DIFF_SRC, gx}});
  r.bwd_weights = best(convolution_backward_weights(wpd),
                       {{DNNL_ARG_SRC, x_w}, {DNNL_ARG_DIFF_DST, gy_w}, {DNNL_ARG_DIFF_WEIGHTS, gw}});
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "kiln_bf16_bench: this CPU has no AVX-512; nothing is measured\n");
    return 1;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const int64_t fi = calibrate(fp32_loop, seconds);
  const double f1 = peak(fp32_loop, 12 * 32, 1, fi), fa = peak(fp32_loop, 12 * 32, hw, fi);
  std::printf("fp32 512-bit FMA peak:        1 thread %7.1f GFLOP/s, %d threads %7.1f GFLOP/s\n", f1, hw, fa);
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  double b1 = 0, ba = 0;
  if (has_bf16) {
    const int64_t bi = calibrate(bf16_loop, seconds);
    b1 = peak(bf16_loop, 12 * 64, 1, bi);
    ba = peak(bf16_loop, 12 * 64, hw, bi);
    std::printf("bf16 vdpbf16ps peak:          1 thread %7.1f GFLOP/s, %d threads %7.1f GFLOP/s (%.2fx fp32)\n", b1, hw,
                ba, ba / fa);
  } else {
    std::printf("bf16: this CPU has no AVX512_BF16 (vdpbf16ps); bf16 products would run as converted fp32\n");
  }

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  // The shapes of the GEMM-bound steps: the MLP sample at batch 512 (784 -> 512 in the forward pass; the backward
  // products have the transposed shapes and the same FLOP), the GPT sample (samples/shakespeare_char.toml: batch 12 x
  // block 64 = 768 rows, n_embd 128, the MLP's 4 x 128 = 512), nanoGPT's default model (batch 64 x block 256 = 16384
  // rows, n_embd 384), and a square reference.
  struct Shape {
    const char* what;
    int64_t m, k, n;
  };
  const Shape shapes[] = {{"mlp512 layer 1 (512x784 . 784x512)", 512, 784, 512},
                          {"gpt sample qkv (768x128 . 128x384)", 768, 128, 384},
                          {"gpt sample mlp up (768x128 . 128x512)", 768, 128, 512},
                          {"gpt sample mlp down (768x512 . 512x128)", 768, 512, 128},
                          {"nanogpt mlp up (16384x384 . 384x1536)", 16384, 384, 1536},
                          {"nanogpt mlp down (16384x1536 . 1536x384)", 16384, 1536, 384},
                          {"square 1024", 1024, 1024, 1024}};
  std::printf("\noneDNN %d.%d matmul, %d threads, best over %.1f s each (GFLOP/s; fraction of the measured peak):\n",
              dnnl_version()->major, dnnl_version()->minor, hw, seconds);
  for (const Shape& s : shapes) {
    const double f = matmul(eng, st, s.m, s.k, s.n, dnnl::memory::data_type::f32, seconds);
    std::printf("  %-42s fp32 %7.1f (%.0f%%)", s.what, f, 100 * f / fa);
    if (has_bf16) {
      const double b = matmul(eng, st, s.m, s.k, s.n, dnnl::memory::data_type::bf16, seconds);
      std::printf("  bf16 %7.1f (%.0f%% of bf16 peak)  %.2fx", b, 100 * b / ba, b / f);
    }
    std::printf("\n");
  }

  // The convolutions of the CNN sample at batch 256 and of the ResNet sample (batch 128), 3x3 stride 1 padding 1.
  struct Conv {
    const char* what;
    int64_t n, c, k, hw;
  };
  const Conv convs[] = {{"cnn256 conv1 (256x1x28x28 -> 32)", 256, 1, 32, 28},
                        {"cnn256 conv2 (256x32x14x14 -> 64)", 256, 32, 64, 14},
                        {"resnet 16 ch (128x16x28x28 -> 16)", 128, 16, 16, 28},
                        {"resnet 32 ch (128x32x14x14 -> 32)", 128, 32, 32, 14},
                        {"resnet 64 ch (128x64x7x7 -> 64)", 128, 64, 64, 7}};
  std::printf("\noneDNN %d.%d 3x3 convolutions, %d threads (GFLOP/s fp32 -> bf16, bf16/fp32):\n", dnnl_version()->major,
              dnnl_version()->minor, hw);
  for (const Conv& c : convs) {
    const ConvRates f = conv3x3(eng, st, c.n, c.c, c.k, c.hw, dnnl::memory::data_type::f32, seconds);
    std::printf("  %-36s fwd %6.1f", c.what, f.fwd);
    if (!has_bf16) {
      std::printf("  bwd data %6.1f  bwd weights %6.1f\n", f.bwd_data, f.bwd_weights);
      continue;
    }
    const ConvRates b = conv3x3(eng, st, c.n, c.c, c.k, c.hw, dnnl::memory::data_type::bf16, seconds);
    std::printf(" -> %6.1f %.2fx  bwd data %6.1f -> %6.1f %.2fx  bwd weights %6.1f -> %6.1f %.2fx\n", b.fwd,
                b.fwd / f.fwd, f.bwd_data, b.bwd_data, b.bwd_data / f.bwd_data, f.bwd_weights, b.bwd_weights,
                b.bwd_weights / f.bwd_weights);
  }
  return 0;
}
