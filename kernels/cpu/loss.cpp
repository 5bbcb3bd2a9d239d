// Fused losses: value and gradient in one pass. Each fixed range sums into its own double slot; the slots
// are added in order, so the loss does not depend on scheduling.
#include "loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

// Runs body(begin, end) -> double over [0, n) cut into `parts` fixed ranges, and returns their sum in
// range order.
template <class Body>
double ordered_sum(ThreadPool& pool, int64_t n, int64_t parts, double* partials, Body body) {
  if (parts > n) parts = n;
  if (parts <= 1) return body(int64_t{0}, n);
  pool.run(parts, [&](int64_t c, int) { partials[c * 8] = body(n * c / parts, n * (c + 1) / parts); });
  double total = 0;
  for (int64_t c = 0; c < parts; ++c) total += partials[c * 8];
  return total;
}

// Logits and their gradient in float32 or bf16 (rows staged whole, bf16_io.hpp); labels and the loss float32.
template <class X, class D>
void softmax_cross_entropy(const LossAttrs& a, const X* x_store, const float* labels, float* loss, D* dx_store,
                           double* partials, ThreadPool& pool) {
  const int64_t cols = a.cols;
  const float scale = a.scale;
  const double total = ordered_sum(pool, a.rows, parts_for(a.rows * cols, pool), partials, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> bx, bd;
    if constexpr (!std::is_same_v<X, float>) bx.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<D, float>) bd.resize(static_cast<size_t>(cols));
    double acc = 0;
    for (int64_t r = b; r < e; ++r) {
      const float* xr = f32_in(x_store + r * cols, cols, bx.data());
      float* dr = f32_out(dx_store + r * cols, bd.data());
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, xr[j]);
      const float sum = exp_shift_sum(xr, mx, dr, cols);
      if (a.soft_labels) {  // t_r: one-hot or class probabilities
        const float* tr = labels + r * cols;
        const double lse = double(mx) + std::log(double(sum));
        double tsum = 0, term = 0;
        for (int64_t j = 0; j < cols; ++j) tsum += tr[j], term += double(tr[j]) * (lse - double(xr[j]));
        const float k = static_cast<float>(tsum) * scale / sum;
        for (int64_t j = 0; j < cols; ++j) dr[j] = dr[j] * k - scale * tr[j];
        f32_commit(dr, dx_store + r * cols, cols);
        acc += term;
        continue;
      }
      const float lf = labels[r];
      const bool ok = lf >= 0.f && lf < static_cast<float>(cols);  // NaN labels fail too
      const int64_t label = ok ? static_cast<int64_t>(lf) : -1;
      const float k = scale / sum;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dr[j] *= k;
      if (ok) {
        dr[label] -= scale;
        acc += double(mx) + std::log(double(sum)) - double(xr[label]);
      } else {
        acc += std::numeric_limits<double>::quiet_NaN();
      }
      f32_commit(dr, dx_store + r * cols, cols);
    }
    return acc;
  });
  loss[0] = static_cast<float>(double(scale) * total);
}

void mean_squared_error(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                        ThreadPool& pool) {
  const int64_t n = a.rows * a.cols;
  const float per = a.cols > 0 ? a.scale / static_cast<float>(a.cols) : 0.f;
  const float g2 = 2.f * per;
  const double total = ordered_sum(pool, n, parts_for(n, pool), partials, [&](int64_t b, int64_t e) {
    float acc = 0.f;  // float lanes, summed per thread into double below
    double out = 0;
    for (int64_t c = b; c < e; c += 4096) {  // blocks keep the float partial sums short
      const int64_t ce = std::min(e, c + 4096);
      acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = c; i < ce; ++i) {
        const float d = p[i] - t[i];
        dp[i] = g2 * d;
        acc += d * d;
      }
      out += acc;
    }
    return out;
  });
  loss[0] = static_cast<float>(double(per) * total);
}

void binary_cross_entropy(const LossAttrs& a, const float* p, const float* t, float* loss, float* dp, double* partials,
                          ThreadPool& pool) {
  const int64_t n = a.rows * a.cols;
  const float per = a.cols > 0 ? a.scale / static_cast<float>(a.cols) : 0.f;
  const bool logits = a.from_logits;
  const double total = ordered_sum(pool, n, parts_for(n, pool), partials, [&](int64_t b, int64_t e) {
    double out = 0;
    for (int64_t i = b; i < e; ++i) {
      const float z = p[i], tv = t[i];
      if (logits) {
        const float s = sigmoid_approx(z);
        dp[i] = per * (s - tv);
        out += double(std::max(z, 0.f)) - double(z) * tv + std::log1p(std::exp(-std::fabs(double(z))));
      } else {
        const float pc = std::clamp(z, 1e-7f, 1.f - 1e-7f);
        dp[i] = per * (pc - tv) / (pc * (1.f - pc));
        out += -(double(tv) * std::log(double(pc)) + (1.0 - tv) * std::log(1.0 - double(pc)));
      }
    }
    return out;
  });
  loss[0] = static_cast<float>(double(per) * total);
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

// Logits and dlogits in float32 or bf16; labels and the loss are float32 (check_call requires it).
KILN_CPU_KERNEL("softmax_cross_entropy", {[](CpuDevice& d, const OpCall& c) {
                                            with_type(c.in[0].dtype, [&](auto x) {
                                              with_type(c.out[1].dtype, [&](auto dx) {
                                                softmax_cross_entropy(
                                                    attrs<LossAttrs>(c), buf_as<const decltype(x)>(c.in[0]), in(c, 1),
                                                    out(c, 0), buf_as<decltype(dx)>(c.out[1]), d.partials(), d.pool());
                                              });
                                            });
                                          },
                                          nullptr, nullptr,
                                          [](const OpCall& c) {
                                            return f32_or_bf16(c.in[0].dtype) && f32_or_bf16(c.out[1].dtype) &&
                                                   c.in[1].dtype == DType::f32 && c.out[0].dtype == DType::f32;
                                          }});
KILN_CPU_KERNEL("mean_squared_error", {[](CpuDevice& d, const OpCall& c) {
                  mean_squared_error(attrs<LossAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.partials(),
                                     d.pool());
                }});
KILN_CPU_KERNEL("binary_cross_entropy", {[](CpuDevice& d, const OpCall& c) {
                  binary_cross_entropy(attrs<LossAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.partials(),
                                       d.pool());
                }});

}  // namespace kiln::cpu
