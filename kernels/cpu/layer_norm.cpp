// Layer normalization over the last dimension, forward and backward. Rows are independent (split over threads);
// the parameter gradients are split over columns, so each thread sums its columns over every row in order:
// deterministic for any thread count, no atomics. beta and dbeta are null without a bias.
#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

template <class X, class Y>
void layer_norm_forward(const LayerNormAttrs& a, const X* x, const float* gamma, const float* beta, Y* y, float* mean,
                        float* rstd, ThreadPool& pool) {
  const int64_t C = a.cols;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, a.rows, parts_for(a.rows * C, pool), [&](int64_t b, int64_t e) {
    thread_local std::vector<float> bx, by;
    if constexpr (!std::is_same_v<X, float>) bx.resize(static_cast<size_t>(C));
    if constexpr (!std::is_same_v<Y, float>) by.resize(static_cast<size_t>(C));
    for (int64_t r = b; r < e; ++r) {
      const float* xr = f32_in(x + r * C, C, bx.data());
      float* yr = f32_out(y + r * C, by.data());
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const float m = sum * inv_c;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (xr[c] - m) * (xr[c] - m);
      const float rs = 1.f / std::sqrt(sq * inv_c + a.eps);
      if (beta) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * gamma[c];
      }
      f32_commit(yr, y + r * C, C);
      mean[r] = m;
      rstd[r] = rs;
    }
  });
}

template <class X, class D, class G>
void layer_norm_backward(const LayerNormAttrs& a, const X* x, const float* gamma, const float* mean, const float* rstd,
                         const D* dy, G* dx, float* dgamma, float* dbeta, ThreadPool& pool) {
  const int64_t C = a.cols, R = a.rows;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, R, parts_for(R * C, pool), [&](int64_t b, int64_t e) {
    thread_local std::vector<float> bx, bd, bo;
    if constexpr (!std::is_same_v<X, float>) bx.resize(static_cast<size_t>(C));
    if constexpr (!std::is_same_v<D, float>) bd.resize(static_cast<size_t>(C));
    if constexpr (!std::is_same_v<G, float>) bo.resize(static_cast<size_t>(C));
    for (int64_t r = b; r < e; ++r) {
      const float* xr = f32_in(x + r * C, C, bx.data());
      const float* dyr = f32_in(dy + r * C, C, bd.data());
      float* dxr = f32_out(dx + r * C, bo.data());
      const float m = mean[r], rs = rstd[r];
      float sg = 0.f, sgx = 0.f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyr[c] * gamma[c];
        sg += g;
        sgx += g * (xr[c] - m) * rs;
      }
      const float mg = sg * inv_c, mgx = sgx * inv_c;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * gamma[c] - mg - (xr[c] - m) * rs * mgx);
      f32_commit(dxr, dx + r * C, C);
    }
  });
  // Columns in ranges of at most kTile, each staged per row (bf16_io.hpp); indices below stay global (c), the
  // staged pointers are shifted to match.
  const int64_t col_parts = std::max(parts_for(R * C, pool), (C + kTile - 1) / kTile);
  parallel_ranges(pool, C, col_parts, [&](int64_t cb, int64_t ce) {
    alignas(64) float bx[kTile], bd[kTile];
    for (int64_t c = cb; c < ce; ++c) {
      dgamma[c] = 0.f;
      if (dbeta) dbeta[c] = 0.f;
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = f32_in(x + r * C + cb, ce - cb, bx) - cb;
      const float* dyr = f32_in(dy + r * C + cb, ce - cb, bd) - cb;
      const float m = mean[r], rs = rstd[r];
#pragma omp simd
      for (int64_t c = cb; c < ce; ++c) dgamma[c] += dyr[c] * (xr[c] - m) * rs;
      if (dbeta) {
#pragma omp simd
        for (int64_t c = cb; c < ce; ++c) dbeta[c] += dyr[c];
      }
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

// gamma, beta, mean and rstd are float32 (parameters and saved statistics); x, y, dy and dx float32 or bf16.
bool layer_norm_takes(const OpCall& c) {
  if (!all_f32_or_bf16(c)) return false;
  const bool fwd = c.kind == OpKind::LayerNormForward;
  for (size_t i = 0; i < c.in.size(); ++i)
    if ((fwd ? i != 0 : i != 0 && i != 4) && c.in[i].dtype != DType::f32) return false;
  for (size_t i = 1; i < c.out.size(); ++i)
    if (c.out[i].dtype != DType::f32) return false;
  return true;
}

KILN_CPU_KERNEL("layer_norm_forward",
                {[](CpuDevice& d, const OpCall& c) {
                   const auto& a = attrs<LayerNormAttrs>(c);
                   with_type(c.in[0].dtype, [&](auto x) {
                     with_type(c.out[0].dtype, [&](auto y) {
                       layer_norm_forward(a, buf_as<const decltype(x)>(c.in[0]), in(c, 1), a.bias ? in(c, 2) : nullptr,
                                          buf_as<decltype(y)>(c.out[0]), out(c, 1), out(c, 2), d.pool());
                     });
                   });
                 },
                 nullptr, nullptr, layer_norm_takes});
KILN_CPU_KERNEL("layer_norm_backward", {[](CpuDevice& d, const OpCall& c) {
                                          const auto& a = attrs<LayerNormAttrs>(c);
                                          with_type(c.in[0].dtype, [&](auto x) {
                                            with_type(c.in[4].dtype, [&](auto dy) {
                                              with_type(c.out[0].dtype, [&](auto dx) {
                                                layer_norm_backward(
                                                    a, buf_as<const decltype(x)>(c.in[0]), in(c, 1), in(c, 2), in(c, 3),
                                                    buf_as<const decltype(dy)>(c.in[4]), buf_as<decltype(dx)>(c.out[0]),
                                                    out(c, 1), a.bias ? out(c, 2) : nullptr, d.pool());
                                              });
                                            });
                                          });
                                        },
                                        nullptr, nullptr, layer_norm_takes});

}  // namespace kiln::cpu
