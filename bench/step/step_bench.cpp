// Times Kiln's training step for a config:
//   kiln_step_bench CONFIG [--set k=v]... [--steps N] [--warmup N] [--ids V] [--classes C]
// Uses a fixed random batch at [train] batch_size, so only the step (copy-in, forward, backward, update) is timed:
// inputs uniform in [0, 1), or integer ids below V with --ids (a model that starts with an embedding, the GPT
// sample: --ids 65 --classes 65); labels class indices below C (default 10), shaped as the model's labels (with
// --ids, one per input position).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kiln/plugin_loader.hpp"
#include "kiln/session.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: kiln_step_bench CONFIG [--set key=value]... [--steps N] [--warmup N]\n";
    return 2;
  }
  std::string cfg_path = argv[1];
  std::vector<std::string> sets;
  int steps = 200, warmup = 20;
  unsigned ids = 0, classes = 10;
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
  } catch (const std::exception& e) {
    std::cerr << "kiln_step_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
