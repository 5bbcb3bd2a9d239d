// Row-wise softmax, with attention's causal mask where SoftmaxAttrs::causal asks for it. Outputs may alias inputs
// element for element (ops.hpp), which `omp simd` allows: each lane reads its element before the vector is stored.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16_io.hpp"
#include "bf16_rows.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"
#include "vec_math.hpp"

namespace kiln::cpu {
namespace {

// float32 rows are computed in place; bf16 rows convert in registers (softmax_row_io), their exponentials held in a
// float32 buffer per thread: attention's rows are short (block size), and a loss or classifier row of a few
// thousand floats still fits in L1/L2.

// One row with bf16 storage on either side, converted in registers (bf16_io.hpp): the max and the exponentials read
// x directly, the exponentials wait in e (float32, L1) for the sum, and y is written once, rounded. exp_shift_sum's
// arithmetic but for the order of the sum across lanes (a tree: a shorter dependency chain per row). A causal row's
// partial last vector is read whole when the row holds 8 more values (the masked columns are the same row's
// storage), its lanes past `valid` masked out, instead of element by element: most causal rows have such a tail.
template <bool kCvt, class X, class Y>
void softmax_row_io(const X* x, Y* y, float* e, int64_t valid, int64_t cols) {
  using v8i = int32_t __attribute__((vector_size(32)));
  const int64_t v8 = valid / 8 * 8, rem = valid - v8;
  const bool whole = rem > 0 && v8 + 8 <= cols;
  const v8i live = v8i{0, 1, 2, 3, 4, 5, 6, 7} < static_cast<int32_t>(rem);
  v8f mv = splat8(-INFINITY);
  for (int64_t j = 0; j < v8; j += 8) {
    const v8f v = load8(x + j);
    mv = mv < v ? v : mv;  // std::max's choice: a NaN never wins the max (it spreads through the sum instead)
  }
  v8f tail = splat8(-INFINITY);
  if (whole) {
    tail = live ? load8(x + v8) : tail;
    mv = mv < tail ? tail : mv;
  }
  float mx = hmax8(mv);
  if (!whole)
    for (int64_t k = v8; k < valid; ++k) mx = std::max(mx, to_f32(x[k]));
  v8f acc = {};
  for (int64_t j = 0; j < v8; j += 8) {
    const v8f ev = exp8(load8(x + j) - mx);
    store8(e + j, ev);
    acc += ev;
  }
  if (whole) {
    const v8f ev = live ? exp8(tail - mx) : v8f{};
    store8(e + v8, ev);
    acc += ev;
  }
  float sum = hsum8_tree(acc);
  if (!whole && rem > 0) {
    float b[8];
    store8(b, exp8(load8_n(x + v8, rem) - mx));
    for (int64_t k = 0; k < rem; ++k) {
      e[v8 + k] = b[k];
      sum += b[k];
    }
  }
  const float inv = 1.f / sum;
  int64_t done = valid;
  if (whole) {
    map8_io<kCvt>(e, y, v8, [inv](v8f v) { return v * inv; });
    store8_as<kCvt>(y + v8, live ? load8(e + v8) * inv : v8f{});  // +0 past valid, whatever inv is
    done = v8 + 8;
  } else {
    map8_io<kCvt>(e, y, valid, [inv](v8f v) { return v * inv; });
  }
  for (; done + 8 <= cols; done += 8) std::memset(static_cast<void*>(y + done), 0, 8 * sizeof(Y));  // +0 either way
  std::memset(static_cast<void*>(y + done), 0, static_cast<size_t>(cols - done) * sizeof(Y));
}

template <class X, class Y>
void softmax_forward(const SoftmaxAttrs& a, const X* x, Y* y, ThreadPool& pool) {
  const int64_t cols = a.cols;
  if (cols == 0) return;
  if constexpr (!std::is_same_v<X, float> || !std::is_same_v<Y, float>) {
    with_bf16_cvt([&](auto cvt) {
      parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
        thread_local std::vector<float> be;
        be.resize(static_cast<size_t>(cols));
        for (int64_t r = rb; r < re; ++r)
          softmax_row_io<decltype(cvt)::value>(x + r * cols, y + r * cols, be.data(), a.causal ? r % cols + 1 : cols,
                                               cols);
      });
    });
    return;
  }
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    thread_local std::vector<float> bx, by;
    if constexpr (!std::is_same_v<X, float>) bx.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<Y, float>) by.resize(static_cast<size_t>(cols));
    for (int64_t r = rb; r < re; ++r) {
      const int64_t valid = a.causal ? r % cols + 1 : cols;  // causal: the columns after r % cols are masked
      const float* xr = f32_in(x + r * cols, valid, bx.data());
      float* yr = f32_out(y + r * cols, by.data());
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, xr[j]);
      const float inv = 1.f / exp_shift_sum(xr, mx, yr, valid);
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j) yr[j] *= inv;
      std::fill(yr + valid, yr + cols, 0.f);
      f32_commit(yr, y + r * cols, cols);
    }
  });
}

template <class Y, class D, class X>
void softmax_backward(const SoftmaxAttrs& a, const Y* y, const D* dy, X* dx, ThreadPool& pool) {
  const int64_t cols = a.cols;
  if constexpr (!std::is_same_v<Y, float> || !std::is_same_v<D, float> || !std::is_same_v<X, float>) {
#ifdef KILN_CPU_AVX512_ROWS
    if constexpr (std::is_same_v<Y, bf16> && std::is_same_v<D, bf16> && std::is_same_v<X, bf16>) {
      if (has_avx512_rows()) {  // bf16_rows.hpp: the same bits, 16 values a vector
        parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
          for (int64_t r = rb; r < re; ++r)
            softmax_backward_row_avx512(y + r * cols, dy + r * cols, dx + r * cols, cols);
        });
        return;
      }
    }
#endif
    with_bf16_cvt([&](auto cvt) {
      parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
        for (int64_t r = rb; r < re; ++r)
          softmax_backward_row_io<decltype(cvt)::value>(y + r * cols, dy + r * cols, dx + r * cols, cols);
      });
    });
    return;
  }
  parallel_ranges(pool, a.rows, parts_for(a.rows * cols, pool), [&](int64_t rb, int64_t re) {
    thread_local std::vector<float> by, bd, bo;
    if constexpr (!std::is_same_v<Y, float>) by.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<D, float>) bd.resize(static_cast<size_t>(cols));
    if constexpr (!std::is_same_v<X, float>) bo.resize(static_cast<size_t>(cols));
    for (int64_t r = rb; r < re; ++r) {
      const float* yr = f32_in(y + r * cols, cols, by.data());
      const float* dyr = f32_in(dy + r * cols, cols, bd.data());
      float* dxr = f32_out(dx + r * cols, bo.data());
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
      f32_commit(dxr, dx + r * cols, cols);
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("softmax_forward", {[](CpuDevice& d, const OpCall& c) {
                                      with_type(c.in[0].dtype, [&](auto x) {
                                        with_type(c.out[0].dtype, [&](auto y) {
                                          softmax_forward(attrs<SoftmaxAttrs>(c), buf_as<const decltype(x)>(c.in[0]),
                                                          buf_as<decltype(y)>(c.out[0]), d.pool());
                                        });
                                      });
                                    },
                                    nullptr, nullptr, all_f32_or_bf16});
KILN_CPU_KERNEL("softmax_backward", {[](CpuDevice& d, const OpCall& c) {
                                       with_type(c.in[0].dtype, [&](auto y) {
                                         with_type(c.in[1].dtype, [&](auto dy) {
                                           with_type(c.out[0].dtype, [&](auto dx) {
                                             softmax_backward(attrs<SoftmaxAttrs>(c),
                                                              buf_as<const decltype(y)>(c.in[0]),
                                                              buf_as<const decltype(dy)>(c.in[1]),
                                                              buf_as<decltype(dx)>(c.out[0]), d.pool());
                                           });
                                         });
                                       });
                                     },
                                     nullptr, nullptr, all_f32_or_bf16});

}  // namespace kiln::cpu
