// Activations (relu, sigmoid, tanh, gelu, gelu_tanh, silu) on float32 or bf16 storage (float32 arithmetic, tiles
// staged as bf16_io.hpp says). Outputs may alias inputs element for element (ops.hpp): each tile is read before it
// is written.
#include <algorithm>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

// bf16_out: the result is stored as bf16, so gelu takes vec_math.hpp's cheaper Phi (within a bf16 rounding).
void forward_tile(Activation act, const float* x, float* y, int64_t n, bool bf16_out) {
  switch (act) {
    case Activation::relu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.f ? 0.f : x[i];  // NaN passes through
      break;
    case Activation::sigmoid:
      map8(x, y, n, sigmoid8);
      break;
    case Activation::tanh:
      map8(x, y, n, tanh8);
      break;
    case Activation::gelu:
      if (bf16_out)
        map8(x, y, n, gelu_bf16_8);
      else
        map8(x, y, n, gelu8);
      break;
    case Activation::gelu_tanh:
      map8(x, y, n, gelu_tanh8);
      break;
    case Activation::silu:
      map8(x, y, n, silu8);
      break;
  }
}

void backward_tile(Activation act, const float* y, const float* dy, float* dx, int64_t n, bool bf16_out) {
  switch (act) {
    case Activation::relu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i];  // loaded unconditionally so the select vectorizes (no branch per element)
        dx[i] = y[i] > 0.f ? g : 0.f;
      }
      break;
    case Activation::sigmoid:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.f - y[i]);
      break;
    case Activation::tanh:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.f - y[i] * y[i]);
      break;
    case Activation::gelu:  // y holds the forward input x for these three
      if (bf16_out)
        map8_times(y, dy, dx, n, gelu_grad_bf16_8);
      else
        map8_times(y, dy, dx, n, gelu_grad8);
      break;
    case Activation::gelu_tanh:
      map8_times(y, dy, dx, n, gelu_tanh_grad8);
      break;
    case Activation::silu:
      map8_times(y, dy, dx, n, silu_grad8);
      break;
  }
}

template <class X, class Y>
void activation_forward(const ActivationAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    alignas(64) float bx[kTile], by[kTile];
    for (int64_t t = b; t < e; t += kTile) {
      const int64_t n = std::min(kTile, e - t);
      float* yo = f32_out(y + t, by);
      forward_tile(a.act, f32_in(x + t, n, bx), yo, n, std::is_same_v<Y, bf16>);
      f32_commit(yo, y + t, n);
    }
  });
}

template <class Y, class D, class X>
void activation_backward(const ActivationAttrs& a, const Y* y, const D* dy, X* dx, ThreadPool& pool) {
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
    alignas(64) float by[kTile], bd[kTile], bo[kTile];
    for (int64_t t = b; t < e; t += kTile) {
      const int64_t n = std::min(kTile, e - t);
      float* o = f32_out(dx + t, bo);
      backward_tile(a.act, f32_in(y + t, n, by), f32_in(dy + t, n, bd), o, n, std::is_same_v<X, bf16>);
      f32_commit(o, dx + t, n);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("activation_forward", {[](CpuDevice& d, const OpCall& c) {
                                         with_type(c.in[0].dtype, [&](auto x) {
                                           with_type(c.out[0].dtype, [&](auto y) {
                                             using X = decltype(x);
                                             using Y = decltype(y);
                                             activation_forward(attrs<ActivationAttrs>(c), buf_as<const X>(c.in[0]),
                                                                buf_as<Y>(c.out[0]), d.pool());
                                           });
                                         });
                                       },
                                       nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("activation_backward", {[](CpuDevice& d, const OpCall& c) {
                                          with_type(c.in[0].dtype, [&](auto y) {
                                            with_type(c.in[1].dtype, [&](auto dy) {
                                              with_type(c.out[0].dtype, [&](auto dx) {
                                                using Y = decltype(y);
                                                using D = decltype(dy);
                                                using X = decltype(dx);
                                                activation_backward(attrs<ActivationAttrs>(c), buf_as<const Y>(c.in[0]),
                                                                    buf_as<const D>(c.in[1]), buf_as<X>(c.out[0]),
                                                                    d.pool());
                                              });
                                            });
                                          });
                                        },
                                        nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
