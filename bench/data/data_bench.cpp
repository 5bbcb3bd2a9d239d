// Examples/s of Kiln's input pipelines, per epoch and per stage.
//
// A run's own pipeline, as `kiln train` builds it from the config's [data.train] (or [data.test]) section:
//   kiln_data_bench CONFIG [--set key=value]... [--pipeline train|test] [--epochs N] [--label NAME] [--stats 0]
//   e.g. build/bin/kiln_data_bench samples/fashion_mnist_mlp.toml --set train.batch_size=64 --epochs 3
// It times building the pipeline (what `kiln train` does before step 1: opening and checking the files), then N
// epochs (default 3) of reset(epoch) and next() until the end, the consumer only touching each batch. It prints
// one line per epoch, "kiln LABEL epoch E: EXAMPLES examples in S s, R examples/s", with epoch 1's rate also over
// build + epoch 1 (everything a training loop pays before its second epoch), and under it each stage's figures
// for that epoch from collect_stats(): elements produced, busy and wait seconds, bytes read, and the stage's own
// rate, examples/s of busy time (elements x examples per element / busy seconds). bench/data/compare_peers.sh runs
// it beside tf.data and PyTorch's DataLoader on the same sections.
//
// The fixed Fashion-MNIST cases of bench/data/run.sh (no CONFIG):
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
#include "kiln/session.hpp"

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Per-stage figures of one epoch: the difference of two collect_stats() snapshots (the stats are cumulative).
void print_stage_stats(const std::vector<kiln::StageStats>& before, const std::vector<kiln::StageStats>& after,
                       int64_t batch) {
  bool batched = false;  // stages from the first "batch" on produce batches of `batch` examples
  for (size_t i = 0; i < after.size(); ++i) {
    const kiln::StageStats& a = after[i];
    kiln::StageStats b;
    if (i < before.size() && before[i].name == a.name) b = before[i];
    if (a.name == "batch") batched = true;
    const uint64_t el = a.elements - b.elements;
    const double busy = a.busy_seconds - b.busy_seconds, wait = a.wait_seconds - b.wait_seconds;
    const double examples = static_cast<double>(el) * (batched ? static_cast<double>(batch) : 1.0);
    std::printf("    %-10s elements %8llu  busy %7.3f s  wait %7.3f s  read %8.1f MB  own rate %12.0f examples/s\n",
                a.name.c_str(), static_cast<unsigned long long>(el), busy, wait,
                static_cast<double>(a.bytes_read - b.bytes_read) / 1e6, busy > 0 ? examples / busy : 0.0);
  }
}

// A run's own pipeline ([data.train] or [data.test] of CONFIG, with --set overrides), built by kiln::Session as
// `kiln train` builds it.
int run_config(int argc, char** argv) {
  const std::string path = argv[1];
  std::vector<std::string> sets;
  std::string which = "train", label;
  int epochs = 3;
  bool stats = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "kiln_data_bench: " << a << " needs a value\n";
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--set")
      sets.push_back(v);
    else if (a == "--pipeline")
      which = v;
    else if (a == "--epochs")
      epochs = std::stoi(v);
    else if (a == "--label")
      label = v;
    else if (a == "--stats")
      stats = v != "0";
    else {
      std::cerr << "usage: kiln_data_bench CONFIG [--set key=value]... [--pipeline train|test] [--epochs N] "
                   "[--label NAME] [--stats 0]\n";
      return 2;
    }
  }
  kiln::PluginLoader loader;
  kiln::Registry reg = kiln::Registry::with_builtins();
  for (auto& d : kiln::PluginLoader::default_dirs()) loader.load_dir(d, reg);
  kiln::Config cfg = kiln::Config::load_file(path, sets);
  kiln::Session s(cfg, reg);
  if (label.empty()) label = s.run_name();
  if (!s.has_pipeline(which)) {
    std::cerr << "kiln_data_bench: " << path << " has no [data." << which << "] section\n";
    return 2;
  }
  const int64_t batch = s.train().batch_size;
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<kiln::Stage> p = s.make_pipeline(which);
  const double build = seconds_since(t0);
  std::printf("kiln %s: [data.%s] of %s, batch %lld, built in %.3f s; %s\n", label.c_str(), which.c_str(), path.c_str(),
              static_cast<long long>(batch), build,
              p->reading().empty() ? "(the source says nothing of how it reads)" : p->reading().c_str());
  std::vector<kiln::StageStats> before;
  for (int e = 0; e < epochs; ++e) {
    auto [n, dt] = run_epoch(*p, static_cast<uint64_t>(e));
    std::printf("kiln %s epoch %d: %lld examples in %.3f s, %.0f examples/s", label.c_str(), e + 1,
                static_cast<long long>(n), dt, static_cast<double>(n) / dt);
    if (e == 0) std::printf(" (with the build: %.0f examples/s)", static_cast<double>(n) / (dt + build));
    std::printf("\n");
    std::vector<kiln::StageStats> after;
    p->collect_stats(after);
    if (stats) print_stage_stats(before, after, batch);
    before = std::move(after);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] != '-') {
    try {
      return run_config(argc, argv);
    } catch (const std::exception& e) {
      std::cerr << "kiln_data_bench: " << e.what() << "\n";
      return 1;
    }
  }
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
