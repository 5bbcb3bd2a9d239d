// loss_unscale: y = alpha * x with alpha = 1 / loss scale (patched by the executor each step); gradients are float32.
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void unscale(CpuDevice& d, const OpCall& c) {
  const auto& a = attrs<ElementwiseAttrs>(c);
  const float* x = in(c, 0);
  float* y = out(c, 0);
  const float al = a.alpha;
  parallel_ranges(d.pool(), a.count, parts_for(a.count, d.pool()), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i];
  });
}

}  // namespace

KILN_CPU_KERNEL("loss_unscale", {unscale});

}  // namespace kiln::cpu
