// Data-parallel benchmark on logical CPU devices:
//   kiln_parallel_bench CONFIG [--steps N] [--warmup N] [--repeat K] [--mp MP_CONFIG] [--verbose] [--set key=value]...
// For the config's model and global batch it measures (1) step time and scaling over 1, 2 and 4 logical devices,
// (2) how much of the gradient all-reduce bucketing hides behind backward, (3) the optimizer-state memory a sharded
// state saves. Each measurement is a fresh Session (plugins from the build), a fixed random batch, the median of
// N timed steps after a warm-up. Prints markdown tables (bench/results/parallel_cpu.md keeps a run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/plugin_loader.hpp"
#include "kiln/session.hpp"

namespace {

struct Result {
  double median_s = 0;
  double comm_s = 0;   // all-reduce seconds per step (from the runner's report)
  double hidden = -1;  // fraction of it hidden behind backward
  double bubble = -1;  // model_parallel: measured share of device time idle during the step
  std::vector<size_t> optimizer_state_planned, optimizer_state_allocated;
  int64_t batch = 0;
};

struct Bench {
  std::string config;
  std::vector<std::string> sets;
  int steps = 60, warmup = 10;
  bool verbose = false;
  std::vector<std::string> only;  // --only k=v: time just this setup (repeatable), print its report
  std::string mp_config;  // --mp CONFIG: also time a model_parallel config over micro-batch counts  // print each
                          // runner's report (per-replica compute and wait) to stderr
  kiln::PluginLoader loader;
  kiln::Registry reg = kiln::Registry::with_builtins();

  int repeat = 1;  // --repeat K: each setup K times, the fastest median kept (the least disturbed by other load)

  Result run(const std::vector<std::string>& extra) {
    Result best;
    for (int i = 0; i < repeat; ++i) {
      Result r = run_once(extra);
      if (i == 0 || r.median_s < best.median_s) best = r;
    }
    return best;
  }

  Result run_once(const std::vector<std::string>& extra) {
    auto sets_all = sets;
    sets_all.insert(sets_all.end(), extra.begin(), extra.end());
    kiln::Config cfg = kiln::Config::load_file(config, sets_all);
    kiln::Session s(cfg, reg);
    s.open_devices();
    auto ctx = s.runner_context();
    Result r;
    for (const auto& p : s.strategy().plan(ctx)) r.optimizer_state_planned.push_back(p.optimizer_state);
    auto runner = s.strategy().create(ctx);
    const int64_t n = s.train().batch_size;
    r.batch = n;
    kiln::Element b;
    b.batch = n;
    b.x = kiln::HostTensor(s.model().input_shape.with_batch(n));
    b.y = kiln::HostTensor(kiln::Shape{n});
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& v : b.x.data) v = u(rng);
    for (auto& v : b.y.data) v = static_cast<float>(rng() % 10);
    for (int i = 0; i < warmup; ++i) runner->train_step(b, {i, 1e-3f});
    std::vector<double> t;
    for (int i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      runner->train_step(b, {warmup + i, 1e-3f});
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    r.median_s = t[t.size() / 2];
    // "all-reduce 0.120 ms/step, 85% of it hidden behind backward" (cumulative over every step run).
    std::smatch m;
    std::string rep = runner->report();
    if (std::regex_search(rep, m, std::regex("all-reduce ([0-9.]+) ms/step, ([0-9]+)% of it hidden"))) {
      r.comm_s = std::stod(m[1]) / 1e3;
      r.hidden = std::stod(m[2]) / 100.0;
    }
    if (verbose) std::cerr << "--- " << (extra.empty() ? std::string("base") : extra.back()) << "\n" << rep;
    if (std::regex_search(rep, m, std::regex("measured bubble \\(device idle share of the step\\) ([0-9.]+)")))
      r.bubble = std::stod(m[1]);
    for (const auto& d : s.devices())
      r.optimizer_state_allocated.push_back(
          d.allocator->stats().in_use_by_tag[static_cast<size_t>(kiln::MemoryTag::optimizer_state)]);
    return r;
  }
};

std::string kib(size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kiln_parallel_bench CONFIG [--steps N] [--warmup N] [--repeat K] [--mp MP_CONFIG] [--verbose] "
                 "[--set key=value]...\n";
    return 2;
  }
  Bench b;
  b.config = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--set" && i + 1 < argc)
      b.sets.push_back(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      b.steps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      b.warmup = std::stoi(argv[++i]);
    else if (a == "--verbose")
      b.verbose = true;
    else if (a == "--only" && i + 1 < argc)
      b.only.push_back(argv[++i]);
    else if (a == "--mp" && i + 1 < argc)
      b.mp_config = argv[++i];
    else if (a == "--repeat" && i + 1 < argc)
      b.repeat = std::max(1, std::stoi(argv[++i]));
  }
  try {
    for (auto& d : kiln::PluginLoader::default_dirs()) b.loader.load_dir(d, b.reg);
    if (!b.only.empty()) {
      b.verbose = true;
      Result r = b.run(b.only);
      std::printf("median step %.3f ms, %.0f examples/s\n", r.median_s * 1e3, double(r.batch) / r.median_s);
      return 0;
    }
    const unsigned cores = std::thread::hardware_concurrency();
    double load[3] = {0, 0, 0};
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
      std::fclose(f);
    }
    std::printf(
        "host: %u hardware threads, load average %.2f at start; config %s; median of %d timed steps after %d warm-up "
        "steps, best of %d run(s) per setup\n\n",
        cores, load[0], b.config.c_str(), b.steps, b.warmup, b.repeat);
    auto dp = [](int n, int threads, std::vector<std::string> more = {}) {
      std::vector<std::string> v = {"strategy.type=\"data_parallel\"", "device.virtual_devices=" + std::to_string(n),
                                    "device.threads=" + std::to_string(threads)};
      v.insert(v.end(), more.begin(), more.end());
      return v;
    };

    std::printf("## 1. Step time over logical CPU devices (same global batch)\n\n");
    std::printf(
        "| setup | threads/device | step (ms) | examples/s | vs single, 1 device, all cores "
        "|\n|---|---|---|---|---|\n");
    Result base = b.run({"device.threads=0"});
    auto row = [&](const char* name, const std::string& threads, const Result& r) {
      std::printf("| %s | %s | %.3f | %.0f | %.2fx |\n", name, threads.c_str(), r.median_s * 1e3,
                  double(r.batch) / r.median_s, base.median_s / r.median_s);
    };
    row("single, 1 device", "all", base);
    row("single, 1 device", "1", b.run({"device.threads=1"}));
    row("data_parallel, 1 replica", "all", b.run(dp(1, 0)));
    row("data_parallel, 2 replicas", "1", b.run(dp(2, 1)));
    row("data_parallel, 2 replicas", "all", b.run(dp(2, 0)));
    row("data_parallel, 4 replicas", "1", b.run(dp(4, 1)));
    row("data_parallel, 4 replicas, concurrent = false", "all", b.run(dp(4, 0, {"strategy.concurrent=false"})));

    std::printf("\n## 2. Gradient all-reduce hidden behind backward (2 replicas, 1 thread each)\n\n");
    std::printf("| bucket_size | overlap | step (ms) | all-reduce (ms/step) | hidden |\n|---|---|---|---|---|\n");
    for (const char* bucket : {"\"64KiB\"", "\"256KiB\"", "\"1MiB\"", "\"64MiB\""})
      for (const char* overlap : {"true", "false"}) {
        Result r = b.run(
            dp(2, 1, {std::string("strategy.bucket_size=") + bucket, std::string("strategy.overlap=") + overlap}));
        std::printf("| %s | %s | %.3f | %.3f | %.0f%% |\n", bucket, overlap, r.median_s * 1e3, r.comm_s * 1e3,
                    r.hidden * 100);
      }

    std::printf("\n## 3. Optimizer state per replica: replicated vs sharded\n\n");
    std::printf(
        "| replicas | optimizer_state | planned per replica | allocated per replica | step (ms) "
        "|\n|---|---|---|---|---|\n");
    for (int n : {2, 4})
      for (const char* mode : {"replicated", "sharded"}) {
        Result r = b.run(dp(n, 1, {std::string("strategy.optimizer_state=\"") + mode + "\""}));
        std::string planned, alloc;
        for (size_t i = 0; i < r.optimizer_state_planned.size(); ++i) {
          planned += (i ? " / " : "") + kib(r.optimizer_state_planned[i]);
          alloc += (i ? " / " : "") + kib(r.optimizer_state_allocated[i]);
        }
        std::printf("| %d | %s | %s | %s | %.3f |\n", n, mode, planned.c_str(), alloc.c_str(), r.median_s * 1e3);
      }
    if (!b.mp_config.empty()) {
      b.config = b.mp_config;
      std::printf("\n## 4. model_parallel pipeline (%s)\n\n", b.mp_config.c_str());
      std::printf("| micro_batches | concurrent | step (ms) | examples/s | measured bubble |\n|---|---|---|---|---|\n");
      for (int m : {1, 2, 4, 8})
        for (const char* conc : {"true", "false"}) {
          Result r = b.run({"strategy.micro_batches=" + std::to_string(m), std::string("strategy.concurrent=") + conc});
          std::printf("| %d | %s | %.3f | %.0f | %.3f |\n", m, conc, r.median_s * 1e3, double(r.batch) / r.median_s,
                      r.bubble);
        }
    }
  } catch (const std::exception& e) {
    std::cerr << "kiln_parallel_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
