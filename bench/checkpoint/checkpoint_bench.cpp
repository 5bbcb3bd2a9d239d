// Checkpoint I/O benchmark: the checksum's throughput (FNV-1a 64 of format version 1, XXH3-64 of version 2) on a
// buffer in memory, and the time to write (save_checkpoint: stream, checksum, fsync, rename) and read back
// (load_checkpoint: read, verify, parse) a checkpoint of a given size. Results: docs/checkpoint.md.
//   kiln_checkpoint_bench [size_mib=1024] [dir=.]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/checkpoint.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

uint64_t fnv(const char* p, size_t n) {  // as checkpoint.cpp computes it for version 1
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(p[i])) * 1099511628211ull;
  return h;
}

template <class F>
double best_gbps(const std::vector<char>& buf, F f) {  // the best of 3
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto t = Clock::now();
    volatile uint64_t h = f(buf.data(), buf.size());
    (void)h;
    best = std::max(best, static_cast<double>(buf.size()) / secs(t) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024;
  const std::string dir = argc > 2 ? argv[2] : ".";
  std::vector<char> buf(256u << 20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 2654435761u >> 13);
  std::printf("checksum over 256 MiB in memory: FNV-1a 64 %.2f GB/s, XXH3-64 %.2f GB/s\n", best_gbps(buf, fnv),
              best_gbps(buf, [](const char* p, size_t n) { return XXH3_64bits(p, n); }));

  kiln::Checkpoint c;
  c.epoch = 1;
  c.step = 100;
  const int64_t per = (mib << 20) / 8 / 4;  // eight float tensors
  for (int k = 0; k < 8; ++k) {
    std::string name = "t";
    name += std::to_string(k);
    c.tensors.emplace(name, kiln::HostTensor(kiln::Shape{per}, 0.25f * static_cast<float>(k)));
  }
  const std::string path = dir + "/bench-checkpoint.kiln";
  for (int i = 0; i < 2; ++i) {
    auto t = Clock::now();
    kiln::save_checkpoint(path, c);
    const double w = secs(t);
    t = Clock::now();
    auto back = kiln::load_checkpoint(path);
    const double r = secs(t);
    std::printf("checkpoint of %lld MiB: write %.2f s (%.2f GB/s, fsync included), read and verify %.2f s\n",
                static_cast<long long>(std::filesystem::file_size(path) >> 20), w,
                static_cast<double>(std::filesystem::file_size(path)) / w / 1e9, r);
  }
  std::filesystem::remove(path);
  return 0;
}
