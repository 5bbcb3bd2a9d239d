// Samples/s of Kiln's data pipeline on Fashion-MNIST (train set, 60000 images) in several configurations:
// from the gzip files every epoch, from a memory cache, and with augmentation on 1 or 2 map workers.
//   kiln_data_bench [--data DIR] [--epochs N] [--batch B] [--only NAME] [--stats 1]
//   (DIR: default $KILN_FASHION_MNIST, else /usr/share/datasets/fashion-mnist)
// Each case runs one untimed epoch (fills caches), then N timed epochs; prints samples/s per case, and with
// --stats 1 each stage's busy/wait seconds summed over all epochs.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/plugin_loader.hpp"

namespace {

struct Case {
  std::string name;
  std::string stages;  // the stage list between the source and the batch
};

std::unique_ptr<kiln::Stage> build(kiln::Registry& reg, const std::string& toml, int64_t batch) {
  kiln::Config cfg = kiln::Config::load_string(toml, "bench.toml");
  std::unique_ptr<kiln::Stage> cur;
  for (auto& s : cfg.root().table_array("stages")) {
    std::string type = s.get_string("type");
    kiln::StageContext ctx;
    ctx.upstream = std::move(cur);
    ctx.global_batch = batch;
    ctx.seed = 1;
    cur = reg.stage(type)(s, std::move(ctx));
  }
  return cur;
}

// Runs one epoch; returns (examples, seconds).
std::pair<int64_t, double> run_epoch(kiln::Stage& p, uint64_t epoch) {
  auto t0 = std::chrono::steady_clock::now();
  p.reset(epoch);
  int64_t n = 0;
  double sink = 0;
  while (auto b = p.next()) {
    n += b->batch;
    sink += b->x.data[0];
  }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 12345.678) std::puts("");  // keep the loop from being optimised away
  return {n, dt};
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's dataset-fashion-mnist unless KILN_FASHION_MNIST (the bench scripts' setting) or --data says otherwise.
  const char* env_data = std::getenv("KILN_FASHION_MNIST");
  std::string data = env_data && *env_data ? env_data : "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  int64_t batch = 128;
  std::string only;
  bool stats = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--data")
      data = argv[i + 1];
    else if (a == "--epochs")
      epochs = std::stoi(argv[i + 1]);
    else if (a == "--batch")
      batch = std::stoll(argv[i + 1]);
    else if (a == "--only")
      only = argv[i + 1];
    else if (a == "--stats")
      stats = std::string(argv[i + 1]) == "1";
    else {
      std::cerr << "usage: kiln_data_bench [--data DIR] [--epochs N] [--batch B] [--only NAME] [--stats 1]\n";
      return 2;
    }
  }
  const std::string src = "{type = \"idx\", images = \"" + data + "/train-images-idx3-ubyte.gz\", labels = \"" + data +
                          "/train-labels-idx1-ubyte.gz\"}";
  const std::string norm =
      R"({op = "scale", factor = 0.00392156862745098}, {op = "normalize", mean = [0.2860], std = [0.3530]})";
  const std::string aug = R"({op = "random_crop", size = [28, 28], padding = 2}, {op = "flip_horizontal"})";
  const std::string shuf = R"({type = "shuffle", buffer = 60000})";
  const std::vector<Case> cases = {
      {"file", "{type = \"map\", ops = [" + norm + "]}, " + shuf},
      {"file+prefetch",
       "{type = \"map\", ops = [" + norm + "]}, " + shuf + ", {type = \"batch\"}, {type = \"prefetch\"}"},
      {"cache_raw", "{type = \"cache\"}, {type = \"map\", ops = [" + norm + "]}, " + shuf},
      {"cache_mapped", "{type = \"map\", ops = [" + norm + "]}, {type = \"cache\"}, " + shuf},
      {"aug_w1", "{type = \"cache\"}, {type = \"map\", workers = 1, ops = [" + norm + ", " + aug + "]}, " + shuf},
      {"aug_w2", "{type = \"cache\"}, {type = \"map\", workers = 2, ops = [" + norm + ", " + aug + "]}, " + shuf},
      {"file_aug_w1", "{type = \"map\", workers = 1, ops = [" + norm + ", " + aug + "]}, " + shuf},
      {"file_aug_w2", "{type = \"map\", workers = 2, ops = [" + norm + ", " + aug + "]}, " + shuf},
  };
  try {
    kiln::PluginLoader loader;
    kiln::Registry reg = kiln::Registry::with_builtins();
    for (auto& d : kiln::PluginLoader::default_dirs()) loader.load_dir(d, reg);
    std::printf("%-14s %12s %10s   (batch %lld, %d timed epochs after 1 warm-up epoch)\n", "case", "samples/s",
                "s/epoch", static_cast<long long>(batch), epochs);
    for (const auto& c : cases) {
      if (!only.empty() && c.name != only) continue;
      std::string stages = c.stages;
      if (stages.find("type = \"batch\"") == std::string::npos) stages += ", {type = \"batch\"}";
      auto p = build(reg, "stages = [" + src + ", " + stages + "]", batch);
      run_epoch(*p, 0);
      int64_t n = 0;
      double t = 0;
      for (int e = 1; e <= epochs; ++e) {
        auto [k, dt] = run_epoch(*p, static_cast<uint64_t>(e));
        n += k;
        t += dt;
      }
      std::printf("%-14s %12.0f %10.3f\n", c.name.c_str(), static_cast<double>(n) / t, t / epochs);
      if (stats) {
        std::vector<kiln::StageStats> st;
        p->collect_stats(st);
        for (const auto& s : st)
          std::printf("    %-10s elements %8llu  busy %7.3f s  wait %7.3f s\n", s.name.c_str(),
                      static_cast<unsigned long long>(s.elements), s.busy_seconds, s.wait_seconds);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::cerr << "kiln_data_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
