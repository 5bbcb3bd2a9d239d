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
// These four are flattened: with the bf16 forms the file calls vec_math.hpp's functions from enough places that GCC
// stopped inlining them (a call per vector, measured 10-20% slower on the float32 step's activations).
[[gnu::flatten]] void forward_tile(Activation act, const float* x, float* y, int64_t n, bool bf16_out) {
  switch (act) {
    case Activation::relu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.f ? 0.f : x[i];  // NaN passes through
      break;
    case Activation::sigmoid:
      map8(x, y, n, [](v8f v) { return sigmoid8(v); });
      break;
    case Activation::tanh:
      map8(x, y, n, [](v8f v) { return tanh8(v); });
      break;
    case Activation::gelu:
      if (bf16_out)
        map8(x, y, n, [](v8f v) { return gelu_bf16_8(v); });
      else
        map8(x, y, n, [](v8f v) { return gelu8(v); });
      break;
    case Activation::gelu_tanh:
      map8(x, y, n, [](v8f v) { return gelu_tanh8(v); });
      break;
    case Activation::silu:
      map8(x, y, n, [](v8f v) { return silu8(v); });
      break;
  }
}

[[gnu::flatten]] void backward_tile(Activation act, const float* y, const float* dy, float* dx, int64_t n,
                                    bool bf16_out) {
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

// The forms for bf16 storage on some side: inputs converted in registers as they are loaded (bf16_io.hpp's map8_io)
// instead of staged through float32 tiles. A bf16 result still goes through a float32 tile (L1) and is rounded in
// a loop of its own: these functions are long dependency chains (exp, a division), and adding the rounding to the
// same loop measured slower (fewer iterations in flight). The same float32 arithmetic per element as the staged
// form, so the same bits.
// kBf16: the result is stored as bf16 in the end (gelu takes the cheaper Phi, as forward_tile's bf16_out).
template <bool kCvt, bool kBf16, class X, class Y>
[[gnu::flatten]] void forward_io(Activation act, const X* x, Y* y, int64_t n) {
  switch (act) {
    case Activation::relu:
      map8_io<kCvt>(x, y, n, [](v8f v) { return v < 0.f ? v8f{} : v; });  // NaN passes through
      break;
    case Activation::sigmoid:
      map8_io<kCvt>(x, y, n, [](v8f v) { return sigmoid8(v); });
      break;
    case Activation::tanh:
      map8_io<kCvt>(x, y, n, [](v8f v) { return tanh8(v); });
      break;
    case Activation::gelu:
      if constexpr (kBf16)
        map8_io<kCvt>(x, y, n, [](v8f v) { return gelu_bf16_8(v); });
      else
        map8_io<kCvt>(x, y, n, [](v8f v) { return gelu8(v); });
      break;
    case Activation::gelu_tanh:
      map8_io<kCvt>(x, y, n, [](v8f v) { return gelu_tanh8(v); });
      break;
    case Activation::silu:
      map8_io<kCvt>(x, y, n, [](v8f v) { return silu8(v); });
      break;
  }
}

template <bool kCvt, bool kBf16, class Y, class D, class X>
[[gnu::flatten]] void backward_io(Activation act, const Y* y, const D* dy, X* dx, int64_t n) {
  switch (act) {
    case Activation::relu:
      map8_io2<kCvt>(y, dy, dx, n, [](v8f yv, v8f g) { return yv > 0.f ? g : v8f{}; });
      break;
    case Activation::sigmoid:
      map8_io2<kCvt>(y, dy, dx, n, [](v8f yv, v8f g) { return g * yv * (1.f - yv); });
      break;
    case Activation::tanh:
      map8_io2<kCvt>(y, dy, dx, n, [](v8f yv, v8f g) { return g * (1.f - yv * yv); });
      break;
    case Activation::gelu:  // y holds the forward input x for these three
      if constexpr (kBf16)
        map8_io2<kCvt>(y, dy, dx, n, [](v8f xv, v8f g) { return gelu_grad_bf16_8(xv) * g; });
      else
        map8_io2<kCvt>(y, dy, dx, n, [](v8f xv, v8f g) { return gelu_grad8(xv) * g; });
      break;
    case Activation::gelu_tanh:
      map8_io2<kCvt>(y, dy, dx, n, [](v8f xv, v8f g) { return gelu_tanh_grad8(xv) * g; });
      break;
    case Activation::silu:
      map8_io2<kCvt>(y, dy, dx, n, [](v8f xv, v8f g) { return silu_grad8(xv) * g; });
      break;
  }
}

// The ReLU with bf16 on both sides is a choice of bits, the bits forward_io / backward_io and the rounding store
// give, without the float32 round trip (which made the ResNet's bf16 ReLUs take twice the float32 ones' time):
//  forward: a number below zero (sign set, magnitude 1 to 0x7f80) becomes +0, a NaN is quieted (| 0x40, as store8
//  does), anything else is kept (-0 too);
//  backward: dy's bits, a NaN quieted, where y is above zero (0x0001 to 0x7f80 as int16), else +0.
// y may be x, dx may be y or dy, element for element.
inline uint16_t quiet_bits(uint16_t h) { return (h & 0x7fffu) > 0x7f80u ? static_cast<uint16_t>(h | 0x40u) : h; }
#ifdef __AVX2__
inline __m256i quiet16(__m256i h) {
  const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7f80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x40)));
}
#endif
void relu_forward_bits(const bf16* xb, bf16* yb, int64_t n) {
  const auto* x = reinterpret_cast<const uint16_t*>(xb);
  auto* y = reinterpret_cast<uint16_t*>(yb);
  int64_t i = 0;
#ifdef __AVX2__
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i neg = _mm256_and_si256(_mm256_cmpgt_epi16(h, _mm256_set1_epi16(-32768)),
                                         _mm256_cmpgt_epi16(_mm256_set1_epi16(-127), h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm256_andnot_si256(neg, quiet16(h)));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = x[i], mag = h & 0x7fffu;
    y[i] = (h & 0x8000u) && mag != 0 && mag <= 0x7f80u ? uint16_t{0} : quiet_bits(h);
  }
}
void relu_backward_bits(const bf16* yb, const bf16* db, bf16* xb, int64_t n) {
  const auto* y = reinterpret_cast<const uint16_t*>(yb);
  const auto* d = reinterpret_cast<const uint16_t*>(db);
  auto* dx = reinterpret_cast<uint16_t*>(xb);
  int64_t i = 0;
#ifdef __AVX2__
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + i));
    const __m256i g = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + i));
    const __m256i live = _mm256_and_si256(_mm256_cmpgt_epi16(h, _mm256_setzero_si256()),
                                          _mm256_cmpgt_epi16(_mm256_set1_epi16(0x7f81), h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dx + i), _mm256_and_si256(live, quiet16(g)));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = y[i];
    dx[i] = h >= 1 && h <= 0x7f80u ? quiet_bits(d[i]) : uint16_t{0};
  }
}

template <class X, class Y>
void activation_forward(const ActivationAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  if constexpr (std::is_same_v<X, bf16> && std::is_same_v<Y, bf16>) {
    if (a.act == Activation::relu) {
      parallel_ranges(pool, a.count, parts_for(a.count, pool),
                      [&](int64_t b, int64_t e) { relu_forward_bits(x + b, y + b, e - b); });
      return;
    }
  }
  if constexpr (!std::is_same_v<X, float> || !std::is_same_v<Y, float>) {
    with_bf16_cvt([&](auto cvt) {
      constexpr bool kCvt = decltype(cvt)::value;
      parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
        alignas(64) float buf[kTile];
        for (int64_t t = b; t < e; t += kTile) {
          const int64_t n = std::min(kTile, e - t);
          if constexpr (std::is_same_v<Y, float>) {
            forward_io<kCvt, false>(a.act, x + t, y + t, n);
          } else {
            forward_io<kCvt, true>(a.act, x + t, buf, n);
            map8_io<kCvt>(buf, y + t, n, [](v8f v) { return v; });
          }
        }
      });
    });
    return;
  }
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
  if constexpr (std::is_same_v<Y, bf16> && std::is_same_v<D, bf16> && std::is_same_v<X, bf16>) {
    if (a.act == Activation::relu) {
      parallel_ranges(pool, a.count, parts_for(a.count, pool),
                      [&](int64_t b, int64_t e) { relu_backward_bits(y + b, dy + b, dx + b, e - b); });
      return;
    }
  }
  if constexpr (!std::is_same_v<Y, float> || !std::is_same_v<D, float> || !std::is_same_v<X, float>) {
    with_bf16_cvt([&](auto cvt) {
      constexpr bool kCvt = decltype(cvt)::value;
      parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
        alignas(64) float buf[kTile];
        for (int64_t t = b; t < e; t += kTile) {
          const int64_t n = std::min(kTile, e - t);
          if constexpr (std::is_same_v<X, float>) {
            backward_io<kCvt, false>(a.act, y + t, dy + t, dx + t, n);
          } else {
            backward_io<kCvt, true>(a.act, y + t, dy + t, buf, n);
            map8_io<kCvt>(buf, dx + t, n, [](v8f v) { return v; });
          }
        }
      });
    });
    return;
  }
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
