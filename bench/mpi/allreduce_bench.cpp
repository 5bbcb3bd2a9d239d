// All-reduce bandwidth against message size through Kiln's mpi process group (the path data_parallel's buckets take):
//   mpirun -np 2 build/bin/kiln_mpi_bench [--fixed-order] [--max-bytes N]
// Rank 0 prints one row per size: the time of one all-reduce (median of the repetitions), the algorithm bandwidth
// (bytes / time) and the bus bandwidth (2 (n-1)/n bytes / time, what a ring moves per rank).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../plugins/mpi/mpi_group.hpp"

int main(int argc, char** argv) {
  kiln::ProcessGroupOptions o;
  size_t max_bytes = size_t{64} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fixed-order") == 0)
      o.fixed_order = true;
    else if (std::strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc)
      max_bytes = std::stoull(argv[++i]);
  }
  kiln::mpi::MpiGroup g(o);
  const int n = g.size();
  if (g.rank() == 0)
    std::printf(
        "# %d ranks, %s reduction\n| bytes | us per all-reduce | algbw GB/s | busbw GB/s |\n| ---: | ---: | ---: | "
        "---: |\n",
        n, o.fixed_order ? "fixed_order" : "fast");
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    std::vector<float> v(bytes / sizeof(float), 1.f);
    const int reps = bytes <= (size_t{1} << 20) ? 50 : 10;
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      g.sum_floats(v.data(), v.size(), "bench");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 2) t.push_back(s);  // two warm-up rounds
    }
    // Every rank agrees on the median of rank 0's clock through the group itself.
    std::sort(t.begin(), t.end());
    const double med = t[t.size() / 2];
    if (g.rank() == 0)
      std::printf("| %zu | %.1f | %.3f | %.3f |\n", bytes, med * 1e6, static_cast<double>(bytes) / med / 1e9,
                  2.0 * (n - 1) / n * static_cast<double>(bytes) / med / 1e9);
  }
  return 0;
}
