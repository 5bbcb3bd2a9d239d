// Elementwise arithmetic, fill and copy, on float32 or bf16 storage in any mix (float32 arithmetic, tiles staged as
// bf16_io.hpp says). Outputs that ops.hpp lets alias an input do so element for element only: each tile is read
// before it is written.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "bf16_io.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

// y = f(x, z) (z null for one-input ops), tile by tile; f(x, z, y, n) works on float32 tiles.
template <class X, class Z, class Y, class F>
void binary(int64_t count, const X* x, const Z* z, Y* y, ThreadPool& pool, F f) {
  parallel_ranges(pool, count, parts_for(count, pool), [&](int64_t b, int64_t e) {
    alignas(64) float bx[kTile], bz[kTile], by[kTile];
    for (int64_t t = b; t < e; t += kTile) {
      const int64_t n = std::min(kTile, e - t);
      float* o = f32_out(y + t, by);
      f(f32_in(x + t, n, bx), z ? f32_in(z + t, n, bz) : nullptr, o, n);
      f32_commit(o, y + t, n);
    }
  });
}

// With bf16 on some side, the same float32 arithmetic on vectors of 8 converted in registers (bf16_io.hpp's map8_io2)
// instead of staged through float32 tiles: three passes over L1 a tile made the bf16 add of the ResNet's residuals
// as slow as the float32 one (1.12 against 1.20 ms a step), with half the bytes. f8 is f on v8f.
template <class X, class Z, class Y>
constexpr bool any_bf16 = std::is_same_v<X, bf16> || std::is_same_v<Z, bf16> || std::is_same_v<Y, bf16>;
template <class X, class Z, class Y, class F8>
void binary8(int64_t count, const X* x, const Z* z, Y* y, ThreadPool& pool, F8 f8) {
  with_bf16_cvt([&](auto cvt) {
    constexpr bool kCvt = decltype(cvt)::value;
    parallel_ranges(pool, count, parts_for(count, pool), [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<Z, void>)
        map8_io<kCvt>(x + b, y + b, e - b, f8);
      else
        map8_io2<kCvt>(x + b, z + b, y + b, e - b, f8);
    });
  });
}

template <class X, class Z, class Y>
void add(const ElementwiseAttrs& a, const X* x, const Z* z, Y* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  if constexpr (any_bf16<X, Z, Y>) {
    binary8(a.count, x, z, y, pool, [=](v8f u, v8f v) { return al * u + be * v; });
    return;
  }
  binary(a.count, x, z, y, pool, [&](const float* xs, const float* zs, float* ys, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ys[i] = al * xs[i] + be * zs[i];
  });
}

template <class X, class Z, class Y>
void mul(const ElementwiseAttrs& a, const X* x, const Z* z, Y* y, ThreadPool& pool) {
  if constexpr (any_bf16<X, Z, Y>) {
    binary8(a.count, x, z, y, pool, [](v8f u, v8f v) { return u * v; });
    return;
  }
  binary(a.count, x, z, y, pool, [&](const float* xs, const float* zs, float* ys, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ys[i] = xs[i] * zs[i];
  });
}

template <class X, class Y>
void axpby(const ElementwiseAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  const float al = a.alpha, be = a.beta;
  if constexpr (any_bf16<X, Y, Y>) {
    binary8(a.count, x, static_cast<const Y*>(y), y, pool, [=](v8f u, v8f v) { return al * u + be * v; });
    return;
  }
  binary(a.count, x, static_cast<const Y*>(y), y, pool, [&](const float* xs, const float* ys0, float* ys, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ys[i] = al * xs[i] + be * ys0[i];
  });
}

template <class X, class Y>
void scale(const ElementwiseAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  const float al = a.alpha;
  if constexpr (any_bf16<X, Y, Y>) {
    binary8(a.count, x, static_cast<const void*>(nullptr), y, pool, [=](v8f u) { return al * u; });
    return;
  }
  binary(a.count, x, static_cast<const float*>(nullptr), y, pool,
         [&](const float* xs, const float*, float* ys, int64_t n) {
#pragma omp simd
           for (int64_t i = 0; i < n; ++i) ys[i] = al * xs[i];
         });
}

template <class Y>
void fill(const ElementwiseAttrs& a, Y* y, ThreadPool& pool) {
  const Y v = from_f32<Y>(a.alpha);
  parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) { std::fill(y + b, y + e, v); });
}

template <class X, class Y>
void copy(const ElementwiseAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  if constexpr (std::is_same_v<X, Y>) {
    if (x == y) return;
    parallel_ranges(pool, a.count, parts_for(a.count, pool), [&](int64_t b, int64_t e) {
      if (e > b) std::memcpy(y + b, x + b, static_cast<size_t>(e - b) * sizeof(X));
    });
  } else {  // a conversion
    binary(a.count, x, static_cast<const float*>(nullptr), y, pool,
           [&](const float* xs, const float*, float* ys, int64_t n) { std::memcpy(ys, xs, n * sizeof(float)); });
  }
}

// Runs f(x, z, y) with the call's buffers as typed pointers (z and x null where the op has fewer inputs).
template <class F>
void typed(const OpCall& c, F f) {
  const size_t ins = c.in.size();
  with_type(ins > 0 ? c.in[0].dtype : DType::f32, [&](auto x) {
    with_type(ins > 1 ? c.in[1].dtype : DType::f32, [&](auto z) {
      with_type(c.out[0].dtype, [&](auto y) {
        f(ins > 0 ? buf_as<const decltype(x)>(c.in[0]) : nullptr,
          ins > 1 ? buf_as<const decltype(z)>(c.in[1]) : nullptr, buf_as<decltype(y)>(c.out[0]));
      });
    });
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("add",
                {[](CpuDevice& d, const OpCall& c) {
                   typed(c, [&](auto x, auto z, auto y) { cpu::add(attrs<ElementwiseAttrs>(c), x, z, y, d.pool()); });
                 },
                 nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("mul",
                {[](CpuDevice& d, const OpCall& c) {
                   typed(c, [&](auto x, auto z, auto y) { cpu::mul(attrs<ElementwiseAttrs>(c), x, z, y, d.pool()); });
                 },
                 nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("axpby",
                {[](CpuDevice& d, const OpCall& c) {
                   typed(c, [&](auto x, auto, auto y) { cpu::axpby(attrs<ElementwiseAttrs>(c), x, y, d.pool()); });
                 },
                 nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("scale",
                {[](CpuDevice& d, const OpCall& c) {
                   typed(c, [&](auto x, auto, auto y) { cpu::scale(attrs<ElementwiseAttrs>(c), x, y, d.pool()); });
                 },
                 nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("fill", {[](CpuDevice& d, const OpCall& c) {
                           typed(c, [&](auto, auto, auto y) { cpu::fill(attrs<ElementwiseAttrs>(c), y, d.pool()); });
                         },
                         nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("copy", {[](CpuDevice& d, const OpCall& c) {
                           typed(c,
                                 [&](auto x, auto, auto y) { cpu::copy(attrs<ElementwiseAttrs>(c), x, y, d.pool()); });
                         },
                         nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
