// Elementwise arithmetic, fill and copy. Outputs that ops.hpp lets alias an input do so element for element only,
// which `omp simd` loops allow.
#include <algorithm>
#include <cstring>

#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void add(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i] + be * z[i];
  });
}

void mul(const ElementwiseAttrs& a, const float* x, const float* z, float* y, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = x[i] * z[i];
  });
}

void axpby(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i] + be * y[i];
  });
}

void scale(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  const float al = a.alpha;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = al * x[i];
  });
}

void fill(const ElementwiseAttrs& a, float* y, ThreadPool& pool) {
  const float al = a.alpha;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) { std::fill(y + b, y + e, al); });
}

void copy(const ElementwiseAttrs& a, const float* x, float* y, ThreadPool& pool) {
  if (x == y) return;
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    if (e > b) std::memcpy(y + b, x + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("add", {[](CpuDevice& d, const OpCall& c) {
                  cpu::add(attrs<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("mul", {[](CpuDevice& d, const OpCall& c) {
                  cpu::mul(attrs<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("axpby", {[](CpuDevice& d, const OpCall& c) {
                  cpu::axpby(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("scale", {[](CpuDevice& d, const OpCall& c) {
                  cpu::scale(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});
KILN_CPU_KERNEL("fill",
                {[](CpuDevice& d, const OpCall& c) { cpu::fill(attrs<ElementwiseAttrs>(c), out(c, 0), d.pool()); }});
KILN_CPU_KERNEL("copy", {[](CpuDevice& d, const OpCall& c) {
                  cpu::copy(attrs<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool());
                }});

}  // namespace kiln::cpu
