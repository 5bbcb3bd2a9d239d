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

// One row with bf16 storage on either side, converted in registers (bf16_io.hpp) instead of staged through float32
// buffers: x is read three times (sum, squares, output), 2 bytes a value each time. The sums run in sum8_by4's order,
// then the tail: not the float32 kernel's `omp simd` order, so a bf16 result may differ from the float32 kernel's
// in the last float32 bits before rounding.
template <bool kCvt, class X, class Y>
void layer_norm_row_io(const X* x, const float* gamma, const float* beta, Y* y, float inv_c, float eps, int64_t C,
                       float* mean, float* rstd) {
  const int64_t C8 = C / 8 * 8;
  float sum = sum8_by4(C8, [x](int64_t c) { return load8(x + c); });
  for (int64_t k = C8; k < C; ++k) sum += to_f32(x[k]);
  const float m = sum * inv_c;
  float sq = sum8_by4(C8, [x, m](int64_t c) {
    const v8f d = load8(x + c) - m;
    return d * d;
  });
  for (int64_t k = C8; k < C; ++k) sq += (to_f32(x[k]) - m) * (to_f32(x[k]) - m);
  const float rs = 1.f / std::sqrt(sq * inv_c + eps);
  int64_t c = 0;
  if (beta)
    for (; c + 8 <= C; c += 8) store8_as<kCvt>(y + c, (load8(x + c) - m) * rs * load8(gamma + c) + load8(beta + c));
  else
    for (; c + 8 <= C; c += 8) store8_as<kCvt>(y + c, (load8(x + c) - m) * rs * load8(gamma + c));
  for (int64_t k = c; k < C; ++k) y[k] = from_f32<Y>((to_f32(x[k]) - m) * rs * gamma[k] + (beta ? beta[k] : 0.f));
  *mean = m;
  *rstd = rs;
}

template <class X, class Y>
void layer_norm_forward(const LayerNormAttrs& a, const X* x, const float* gamma, const float* beta, Y* y, float* mean,
                        float* rstd, ThreadPool& pool) {
  const int64_t C = a.cols;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  if constexpr (!std::is_same_v<X, float> || !std::is_same_v<Y, float>) {
    with_bf16_cvt([&](auto cvt) {
      parallel_ranges(pool, a.rows, parts_for(a.rows * C, pool), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          layer_norm_row_io<decltype(cvt)::value>(x + r * C, gamma, beta, y + r * C, inv_c, a.eps, C, mean + r,
                                                  rstd + r);
      });
    });
    return;
  }
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

// The backward pass's rows and parameter gradients on bf16 storage converted in registers (as layer_norm_row_io).
// The row sums' order differs from the float32 kernel's; dgamma and dbeta add row by row per column, as it does.
template <bool kCvt, class X, class D, class G>
void layer_norm_backward_io(const LayerNormAttrs& a, const X* x, const float* gamma, const float* mean,
                            const float* rstd, const D* dy, G* dx, float* dgamma, float* dbeta, ThreadPool& pool) {
  const int64_t C = a.cols, R = a.rows;
  const float inv_c = C ? 1.f / static_cast<float>(C) : 0.f;
  parallel_ranges(pool, R, parts_for(R * C, pool), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const X* xr = x + r * C;
      const D* dyr = dy + r * C;
      G* dxr = dx + r * C;
      const float m = mean[r], rs = rstd[r];
      // Two accumulators for each sum (a shorter dependency chain per row, as sum8_by4).
      v8f ag0 = {}, ag1 = {}, agx0 = {}, agx1 = {};
      const int64_t C8 = C / 8 * 8;
      int64_t c = 0;
      for (; c + 16 <= C8; c += 16) {
        const v8f g0 = load8(dyr + c) * load8(gamma + c), g1 = load8(dyr + c + 8) * load8(gamma + c + 8);
        ag0 += g0;
        ag1 += g1;
        agx0 += g0 * (load8(xr + c) - m) * rs;
        agx1 += g1 * (load8(xr + c + 8) - m) * rs;
      }
      for (; c < C8; c += 8) {
        const v8f g = load8(dyr + c) * load8(gamma + c);
        ag0 += g;
        agx0 += g * (load8(xr + c) - m) * rs;
      }
      float sg = hsum8_tree(ag0 + ag1), sgx = hsum8_tree(agx0 + agx1);
      for (int64_t k = c; k < C; ++k) {
        const float g = to_f32(dyr[k]) * gamma[k];
        sg += g;
        sgx += g * (to_f32(xr[k]) - m) * rs;
      }
      const float mg = sg * inv_c, mgx = sgx * inv_c;
      for (c = 0; c + 8 <= C; c += 8) {
        const v8f xv = load8(xr + c);
        store8_as<kCvt>(dxr + c, rs * (load8(dyr + c) * load8(gamma + c) - mg - (xv - m) * rs * mgx));
      }
      for (int64_t k = c; k < C; ++k)
        dxr[k] = from_f32<G>(rs * (to_f32(dyr[k]) * gamma[k] - mg - (to_f32(xr[k]) - m) * rs * mgx));
    }
  });
  const int64_t col_parts = std::max(parts_for(R * C, pool), (C + kTile - 1) / kTile);
  parallel_ranges(pool, C, col_parts, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      dgamma[c] = 0.f;
      if (dbeta) dbeta[c] = 0.f;
    }
    for (int64_t r = 0; r < R; ++r) {
      const X* xr = x + r * C;
      const D* dyr = dy + r * C;
      const float m = mean[r], rs = rstd[r];
      int64_t c = cb;
      for (; c + 8 <= ce; c += 8) {
        const v8f d = load8(dyr + c);
        store8(dgamma + c, load8(dgamma + c) + d * (load8(xr + c) - m) * rs);
        if (dbeta) store8(dbeta + c, load8(dbeta + c) + d);
      }
      for (; c < ce; ++c) {
        const float d = to_f32(dyr[c]);
        dgamma[c] += d * (to_f32(xr[c]) - m) * rs;
        if (dbeta) dbeta[c] += d;
      }
    }
  });
}

template <class X, class D, class G>
void layer_norm_backward(const LayerNormAttrs& a, const X* x, const float* gamma, const float* mean, const float* rstd,
                         const D* dy, G* dx, float* dgamma, float* dbeta, ThreadPool& pool) {
  if constexpr (!std::is_same_v<X, float> || !std::is_same_v<D, float> || !std::is_same_v<G, float>) {
    with_bf16_cvt([&](auto cvt) {
      layer_norm_backward_io<decltype(cvt)::value>(a, x, gamma, mean, rstd, dy, dx, dgamma, dbeta, pool);
    });
    return;
  }
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
