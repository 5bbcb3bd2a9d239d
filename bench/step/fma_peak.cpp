// This CPU's FP32 peak, measured: `kiln_fma_peak [seconds]` runs chains of 256-bit fused multiply-adds (AVX2 + FMA)
// on 1 thread and on every hardware thread, and prints GFLOP/s. One FMA on 8 floats counts 16 FLOP. Twelve
// independent accumulators per thread cover the FMA latency (4 cycles) on two FMA pipes, so the loop is bound by
// issue rate, not latency: Zen 4 reaches 2 x 16 = 32 FLOP per cycle per core this way.
// bench/step/compare_peers.sh states every step's achieved GFLOP/s as a fraction of this figure.
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

volatile double g_sink;  // every result lands here, so no call is optimized away

__attribute__((target("avx2,fma"), noinline)) double fma_loop(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];  // keeps the loop alive
}

// Best of 5 timings of `threads` threads each running `iters` iterations; GFLOP/s over all threads.
double measure(int threads, int64_t iters) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    std::vector<double> sink(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) {
        }
        sink[static_cast<size_t>(t)] = fma_loop(iters);
      });
    while (ready.load() < threads) {
    }
    auto t0 = std::chrono::steady_clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = static_cast<double>(threads) * static_cast<double>(iters) * 12 * 16;
    if (flops / s / 1e9 > best) best = flops / s / 1e9;
    if (sink[0] == 12345.f) std::puts("");
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "kiln_fma_peak: this CPU has no AVX2 + FMA; the peak is not measured\n");
    return 1;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  // Calibrate the iteration count to about `seconds` per timing on one thread.
  int64_t iters = 1 << 20;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    g_sink = fma_loop(iters);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > seconds / 4 || iters > (int64_t{1} << 40)) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / s);
      break;
    }
    iters *= 2;
  }
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const double one = measure(1, iters);
  const double all = measure(hw, iters);
  std::printf("fma peak: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s (AVX2 FMA, FP32, best of 5)\n", one, hw, all);
  return 0;
}
