// Times Kiln's training step for a config:
//   kiln_step_bench CONFIG [--set k=v]... [--steps N] [--warmup N] [--ids V] [--classes C] [--profile]
// Uses a fixed random batch at [train] batch_size, so only the step (copy-in, forward, backward, update) is timed:
// inputs uniform in [0, 1), or integer ids below V with --ids (a model that starts with an embedding, the GPT
// sample: --ids 65 --classes 65); labels class indices below C (default 10), shaped as the model's labels (with
// --ids, one per input position). --profile then runs the same steps on one device once more with every op timed
// to its completion (Executor::set_profile) and prints each op's share of the step, and the share of the products
// (gemm, batched_gemm, the convolutions): what a faster product (bf16) can speed up, by Amdahl's law.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kiln/executor.hpp"
#include "kiln/plugin_loader.hpp"
#include "kiln/session.hpp"
#include "kiln/single_runner.hpp"

namespace {

// The steps once more on the session's first device, each op timed; a table of ops by their share of the step.
void print_profile(kiln::Session& s, const kiln::Element& b, int warmup, int steps) {
  kiln::SingleDeviceRunner runner(s.runner_context(), 0);
  kiln::Executor& ex = runner.executor(b.batch, true, false);
  for (int i = 0; i < warmup; ++i) runner.train_step(b, {i, 1e-3f});
  kiln::OpProfile p;
  ex.set_profile(&p);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) runner.train_step(b, {warmup + i, 1e-3f});
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  ex.set_profile(nullptr);
  std::vector<std::pair<std::string, kiln::OpProfile::Entry>> rows(p.ops.begin(), p.ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& c) { return a.second.seconds > c.second.seconds; });
  double total = 0, products = 0;
  for (const auto& [name, e] : rows) {
    total += e.seconds;
    // A fused group counts as a product when it holds one (its bias, activation and pooling ride along).
    if (name.find("gemm") != std::string::npos || name.find("conv2d") != std::string::npos) products += e.seconds;
  }
  std::printf("profile (%d steps on %s, each op synchronized; %.3f ms/step profiled, %.3f ms in ops):\n", steps,
              s.devices().front().device->info().label().c_str(), wall * 1e3, total / steps * 1e3);
  for (const auto& [name, e] : rows)
    std::printf("  %-48s %8.3f ms/step %5.1f%%  %lld calls/step\n", name.c_str(), e.seconds / steps * 1e3,
                100 * e.seconds / total, static_cast<long long>(e.calls / steps));
  std::printf("products (gemm, batched_gemm, conv2d*, and fused groups holding one): %.1f%% of the ops' time\n",
              100 * products / total);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kiln_step_bench CONFIG [--set key=value]... [--steps N] [--warmup N]\n";
    return 2;
  }
  std::string cfg_path = argv[1];
  std::vector<std::string> sets;
  int steps = 200, warmup = 20;
  unsigned ids = 0, classes = 10;
  bool profile = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--set" && i + 1 < argc)
      sets.push_back(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::stoi(argv[++i]);
    else if (a == "--ids" && i + 1 < argc)
      ids = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--classes" && i + 1 < argc)
      classes = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--profile")
      profile = true;
  }
  try {
    kiln::PluginLoader loader;
    kiln::Registry reg = kiln::Registry::with_builtins();
    for (auto& d : kiln::PluginLoader::default_dirs()) loader.load_dir(d, reg);
    kiln::Config cfg = kiln::Config::load_file(cfg_path, sets);
    kiln::Session s(cfg, reg);
    s.open_devices();
    auto runner = s.strategy().create(s.runner_context());
    int64_t n = s.train().batch_size;
    kiln::Element b;
    b.batch = n;
    b.x = kiln::HostTensor(s.model().input_shape.with_batch(n));
    // A language model's labels are the next ids, one per input position.
    b.y = kiln::HostTensor(ids ? s.model().input_shape.with_batch(n) : s.model().label_shape.with_batch(n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& v : b.x.data) v = ids ? static_cast<float>(rng() % ids) : u(rng);
    for (auto& v : b.y.data) v = static_cast<float>(rng() % classes);
    std::vector<double> times;
    for (int i = 0; i < warmup + steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      runner->train_step(b, {i, 1e-3f});
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warmup) times.push_back(dt);
    }
    std::sort(times.begin(), times.end());
    double med = times[times.size() / 2];
    double mean = 0;
    for (double t : times) mean += t;
    mean /= static_cast<double>(times.size());
    std::printf("kiln %s batch %lld: median %.3f ms/step, mean %.3f ms/step, %.0f examples/s\n", s.run_name().c_str(),
                static_cast<long long>(n), med * 1e3, mean * 1e3, static_cast<double>(n) / med);
    if (profile) print_profile(s, b, warmup, steps);
  } catch (const std::exception& e) {
    std::cerr << "kiln_step_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
