// Bias, elementwise arithmetic, reductions, concat/split and dropout. Outputs that ops.hpp lets alias an
// input do so element for element only, which `omp simd` loops allow.
#include <algorithm>
#include <cstring>

#include "kernels.hpp"
#include "kiln/reference.hpp"

namespace kiln::cpu {
namespace {
bool par_for(int64_t n, int threads) { return threads > 1 && n >= kParallelMin; }
}  // namespace

void bias_add(const BiasAttrs& a, const float* x, const float* b, float* y, int threads) {
  const int64_t C = a.channels, I = a.inner;
  const bool par = par_for(a.outer * C * I, threads);
  if (I == 1) {  // dense: (outer, channels)
#pragma omp parallel for num_threads(threads) if (par) schedule(static)
    for (int64_t o = 0; o < a.outer; ++o) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) y[o * C + c] = x[o * C + c] + b[c];
    }
    return;
  }
#pragma omp parallel for num_threads(threads) if (par) schedule(static)
  for (int64_t oc = 0; oc < a.outer * C; ++oc) {  // one (o, c) plane of `inner` elements
    const float bc = b[oc % C];
    const float* xp = x + oc * I;
    float* yp = y + oc * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) yp[i] = xp[i] + bc;
  }
}

void bias_grad(const BiasAttrs& a, const float* dy, float* db, int threads) {
  const int64_t C = a.channels, I = a.inner, O = a.outer;
  const bool par = par_for(O * C * I, threads);
  if (I == 1) {  // column sums of an (outer, channels) matrix, in column blocks per thread
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) if (par && blocks > 1) schedule(static)
    for (int64_t bl = 0; bl < blocks; ++bl) {
      const int64_t c0 = bl * kBlock, c1 = std::min(C, c0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t o = 0; o < O; ++o) {
        const float* row = dy + o * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      std::copy(acc, acc + (c1 - c0), db + c0);
    }
    return;
  }
#pragma omp parallel for num_threads(threads) if (par && C > 1) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double total = 0;
    for (int64_t o = 0; o < O; ++o) {
      const float* p = dy + (o * C + c) * I;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < I; ++i) s += p[i];
      total += s;
    }
    db[c] = static_cast<float>(total);
  }
}

void add(const ElementwiseAttrs& a, const float* x, const float* z, float* y, int threads) {
  const float al = a.alpha, be = a.beta;
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) y[i] = al * x[i] + be * z[i];
}

void mul(const ElementwiseAttrs& a, const float* x, const float* z, float* y, int threads) {
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) y[i] = x[i] * z[i];
}

void axpby(const ElementwiseAttrs& a, const float* x, float* y, int threads) {
  const float al = a.alpha, be = a.beta;
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) y[i] = al * x[i] + be * y[i];
}

void scale(const ElementwiseAttrs& a, const float* x, float* y, int threads) {
  const float al = a.alpha;
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) y[i] = al * x[i];
}

void fill(const ElementwiseAttrs& a, float* y, int threads) {
  const float al = a.alpha;
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) y[i] = al;
}

void copy(const ElementwiseAttrs& a, const float* x, float* y, int threads) {
  if (x == y || a.count == 0) return;
  const int parts = par_for(a.count, threads) ? threads : 1;
#pragma omp parallel for num_threads(parts) if (parts > 1) schedule(static, 1)
  for (int p = 0; p < parts; ++p) {
    const int64_t b = a.count * p / parts, e = a.count * (p + 1) / parts;
    std::memcpy(y + b, x + b, static_cast<size_t>(e - b) * sizeof(float));
  }
}

void reduce_sum(const ReduceAttrs& a, const float* x, float* y, int threads) {
  const int64_t R = a.reduce, I = a.inner;
  const bool par = par_for(a.outer * R * I, threads);
  if (I == 1) {
#pragma omp parallel for num_threads(threads) if (par && a.outer > 1) schedule(static)
    for (int64_t o = 0; o < a.outer; ++o) {
      double total = 0;
      for (int64_t c = 0; c < R; c += 4096) {  // float lanes over short runs, double across runs
        const int64_t ce = std::min(R, c + 4096);
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t r = c; r < ce; ++r) s += x[o * R + r];
        total += s;
      }
      y[o] = static_cast<float>(total);
    }
    return;
  }
  constexpr int64_t kBlock = 256;  // (outer, inner block) tasks so both shapes spread over the team
  const int64_t blocks = (I + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) if (par && a.outer * blocks > 1) schedule(static)
  for (int64_t task = 0; task < a.outer * blocks; ++task) {
    const int64_t o = task / blocks, i0 = (task % blocks) * kBlock, i1 = std::min(I, i0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < R; ++r) {
      const float* row = x + (o * R + r) * I;
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) acc[i - i0] += row[i];
    }
    std::copy(acc, acc + (i1 - i0), y + o * I + i0);
  }
}

void concat(const ConcatAttrs& a, const float* const* xs, float* y, int threads) {
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  const size_t parts = a.sizes.size();
#pragma omp parallel for num_threads(threads) if (par_for(a.outer * total * a.inner, threads)) schedule(static)
  for (int64_t o = 0; o < a.outer; ++o) {
    int64_t start = 0;
    for (size_t j = 0; j < parts; ++j) {
      const int64_t len = a.sizes[j] * a.inner;
      std::memcpy(y + (o * total + start) * a.inner, xs[j] + o * len, static_cast<size_t>(len) * sizeof(float));
      start += a.sizes[j];
    }
  }
}

void split(const ConcatAttrs& a, const float* y, float* const* xs, int threads) {
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  const size_t parts = a.sizes.size();
#pragma omp parallel for num_threads(threads) if (par_for(a.outer * total * a.inner, threads)) schedule(static)
  for (int64_t o = 0; o < a.outer; ++o) {
    int64_t start = 0;
    for (size_t j = 0; j < parts; ++j) {
      const int64_t len = a.sizes[j] * a.inner;
      std::memcpy(xs[j] + o * len, y + (o * total + start) * a.inner, static_cast<size_t>(len) * sizeof(float));
      start += a.sizes[j];
    }
  }
}

// Same bits as kiln::dropout_uniform, with the per-call part of the hash hoisted out of the loop.
void dropout(const DropoutAttrs& a, const float* x, float* y, int threads) {
  const uint32_t base = kiln_hash32(a.counter ^ kiln_hash32(a.seed));
  const float rate = a.rate, keep_div = 1.0f - a.rate;
#pragma omp parallel for simd num_threads(threads) if (par_for(a.count, threads)) schedule(static)
  for (int64_t i = 0; i < a.count; ++i) {
    const uint32_t h = kiln_hash32(static_cast<uint32_t>(i) ^ base);
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
    const float kept = x[i] / keep_div;  // computed unconditionally so the select vectorizes
    y[i] = u >= rate ? kept : 0.f;
  }
}

}  // namespace kiln::cpu
