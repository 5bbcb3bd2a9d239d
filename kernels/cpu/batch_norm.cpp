// Batch normalization over channels, forward and backward, x viewed as (n, c, inner). Channels are independent and
// split over threads; each thread reduces its channels over every sample in order (deterministic for any thread
// count, no atomics). Long runs (inner >= kShortRun) are summed per run in f32 SIMD lanes and across runs in
// double; short runs (rank-2 input, small images) are summed as blocks of whole channels, contiguous in each
// sample, into double accumulators.
#include "batch_norm.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>

#include "bf16_io_conv.hpp"
#include "cpu_kernel.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {

using bf16io::load;
using bf16io::store;

namespace {

constexpr int64_t kShortRun = 16;
constexpr int64_t kBlock = 1024;         // elements of one sample's block of channels (short runs)
constexpr int64_t kPrefetchBytes = 512;  // of each run ahead: the prefetchers take the rest once the run has begun

// A channel's values are one run of `inner` values in each of the n samples, C * inner apart: the hardware prefetchers
// start over at each run, and its first lines arrive from memory while the sum waits on them (perf put a quarter of
// the bf16 ResNet's batch-norm backward samples on its loads). The first kPrefetchBytes of the next sample's run are
// asked for while this one is summed; the order of every sum stays as it was. (Whole runs were worse for float32:
// 3 KB a run and stream, more requests than the prefetchers needed; 256-512 bytes were best in both precisions.)
// The passes that write a run (the normalization, dx) ask for the next run's first lines for writing, so that the
// stores' read-for-ownership has begun too.
template <bool Write = false, class T>
inline void prefetch_run(const T* p, int64_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  const int64_t bytes = std::min<int64_t>(n * static_cast<int64_t>(sizeof(T)), kPrefetchBytes);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(b + i, Write ? 1 : 0);
}

// Per-channel sums over (n, inner) of f(x) for channels [cb, ce) with short runs: out[k] for channel cb + k.
// T: the activations' storage (float, or uint16_t holding bf16); every sum and statistic is float32/double.
template <class T, class F>
void block_sums(const T* x, int64_t N, int64_t C, int64_t I, int64_t cb, int64_t ce, F f, double* out) {
  double acc[kBlock];
  const int64_t L = (ce - cb) * I;
  std::fill(acc, acc + L, 0.0);
  for (int64_t o = 0; o < N; ++o) {
    const T* xr = x + (o * C + cb) * I;
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) acc[j] += static_cast<double>(f(load(xr[j]), j, o));
  }
  for (int64_t k = 0; k < ce - cb; ++k) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += acc[k * I + i];
    out[k] = s;
  }
}

// Per-channel sum over (n, inner) of f(x) for one channel with long runs.
template <class T, class F>
double channel_sum(const T* x, int64_t N, int64_t C, int64_t I, int64_t c, F f) {
  // Vectorized float partial sums over chunks of 4096 values, added in double: a float sum over a whole run of
  // millions of values would lose the last digits the conformance table checks (2 x 1 x 2,100,001).
  constexpr int64_t kChunk = 4096;
  double s = 0;
  for (int64_t o = 0; o < N; ++o) {
    const T* xr = x + (o * C + c) * I;
    if (o + 1 < N) prefetch_run(xr + C * I, I);
    for (int64_t i0 = 0; i0 < I; i0 += kChunk) {
      const int64_t i1 = std::min(I, i0 + kChunk);
      float p = 0.f;
#pragma omp simd reduction(+ : p)
      for (int64_t i = i0; i < i1; ++i) p += f(load(xr[i]), i, o);
      s += p;
    }
  }
  return s;
}

// The backward pass's two sums for one channel with long runs, in one sweep over dy and x: sum(dy) and
// sum(dy * (x - mu) * r), each as channel_sum adds them (float chunks of 4096, added in double). With a ReLU's
// backward in front (relu), dy = relu_y > 0 ? dz : 0 is computed here and written to dy_out (which may alias dz or
// relu_y): the same values in the same order as the unfused ops, so the same sums.
template <class T>
void channel_sums_backward(const T* dy, const ReluInFrontT<T>* relu, T* dy_out, const T* x, int64_t N, int64_t C,
                           int64_t I, int64_t c, float mu, float r, double& sdy, double& sdyx) {
  constexpr int64_t kChunk = 4096;
  sdy = 0, sdyx = 0;
  for (int64_t o = 0; o < N; ++o) {
    const int64_t off = (o * C + c) * I;
    const T* xr = x + off;
    if (o + 1 < N) {
      prefetch_run(xr + C * I, I);
      if (relu) {
        prefetch_run(relu->relu_y + off + C * I, I);
        prefetch_run(relu->dz + off + C * I, I);
      } else {
        prefetch_run(dy + off + C * I, I);
      }
    }
    for (int64_t i0 = 0; i0 < I; i0 += kChunk) {
      const int64_t i1 = std::min(I, i0 + kChunk);
      float p = 0.f, q = 0.f;
      if (relu) {
        const T *yr = relu->relu_y + off, *dzr = relu->dz + off;
        T* dyr = dy_out + off;
#pragma omp simd reduction(+ : p, q)
        for (int64_t i = i0; i < i1; ++i) {
          // dz's own bits or +0, selected in the storage type (a bf16 store would round, which gives these bits
          // too but does not vectorize); dz is loaded unconditionally so the select vectorizes, as
          // ActivationBackward does.
          const T d = dzr[i];
          const T gb = load(yr[i]) > 0.f ? d : T{};
          dyr[i] = gb;
          const float g = load(gb);
          p += g;
          q += g * (load(xr[i]) - mu) * r;
        }
      } else {
        const T* dyr = dy + off;
#pragma omp simd reduction(+ : p, q)
        for (int64_t i = i0; i < i1; ++i) {
          const float d = load(dyr[i]);
          p += d;
          q += d * (load(xr[i]) - mu) * r;
        }
      }
      sdy += p;
      sdyx += q;
    }
  }
}

// z = ReLU(y) for a fused ActivationForward relu, from y as stored (z may be y): exactly what the unfused op computes
// from that y (v < 0 ? 0 : v, NaN passing through). On bf16 bits: a number below zero (sign set, magnitude neither
// 0 nor NaN) becomes +0; -0 and NaN pass.
void relu_of_stored(const float* y, float* z, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) z[i] = y[i] < 0.f ? 0.f : y[i];
}
void relu_of_stored(const uint16_t* y, uint16_t* z, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = y[i], mag = h & 0x7fffu;
    z[i] = (h & 0x8000u) && mag != 0 && mag <= 0x7f80u ? uint16_t{0} : h;
  }
}

// The normalization and dx passes of long runs on bf16 storage, 16 values a vector where the CPU has AVX512_BF16:
// the widening loads, the same float32 expressions (written with the vector operators, so GCC contracts them as it
// does the scalar loops' omp simd form) and vcvtneps2bf16 (a vector holding a subnormal takes the integer rounding),
// straight into the bf16 run, where the AVX2 form (store_all) stages each chunk through a float32 buffer and rounds 8
// values a call. The ResNet's bf16 losses and weights after 12 steps are the AVX2 form's to the bit.
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_BN_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
using bf16io::has_avx512_bf16;
#ifndef __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
KILN_BN_AVX512 inline __mmask16 lanes16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}
KILN_BN_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
// relu_of_stored on 16 bf16 values: below zero (as int16, -32767 to -128) becomes +0.
KILN_BN_AVX512 inline __m256i relu16(__m256i h) {
  const __mmask16 neg =
      _mm256_cmpgt_epi16_mask(h, _mm256_set1_epi16(-32768)) & _mm256_cmpgt_epi16_mask(_mm256_set1_epi16(-127), h);
  return _mm256_maskz_mov_epi16(static_cast<__mmask16>(~neg), h);
}
KILN_BN_AVX512 void normalize_run_avx512(const uint16_t* x, uint16_t* y, uint16_t* z, int64_t n, float sc, float sh) {
  const __m512 vsc = _mm512_set1_ps(sc), vsh = _mm512_set1_ps(sh);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes16(n - i);
    const __m256i r = bf16io::round16_avx512(load16(x + i, k) * vsc + vsh);
    _mm256_mask_storeu_epi16(y + i, k, r);
    if (z) _mm256_mask_storeu_epi16(z + i, k, relu16(r));
  }
}
KILN_BN_AVX512 void dx_run_avx512(const uint16_t* dy, const uint16_t* x, uint16_t* dx, int64_t n, float c1, float c2,
                                  float c3, float mu) {
  const __m512 v1 = _mm512_set1_ps(c1), v2 = _mm512_set1_ps(c2), v3 = _mm512_set1_ps(c3), vm = _mm512_set1_ps(mu);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes16(n - i);
    _mm256_mask_storeu_epi16(dx + i, k,
                             bf16io::round16_avx512(v1 * load16(dy + i, k) - v2 * (load16(x + i, k) - vm) - v3));
  }
}
#ifndef __clang__
#pragma GCC diagnostic pop
#endif
#else
bool has_avx512_bf16() { return false; }
void normalize_run_avx512(const uint16_t*, uint16_t*, uint16_t*, int64_t, float, float) {}
void dx_run_avx512(const uint16_t*, const uint16_t*, uint16_t*, int64_t, float, float, float, float) {}
#endif

int64_t channels_per_block(int64_t I) { return std::max<int64_t>(1, kBlock / std::max<int64_t>(I, 1)); }

template <class T>
void forward_impl(const BatchNormAttrs& a, const T* x, const float* gamma, const float* beta, T* y, float* mean,
                  float* rstd, float* running_mean, float* running_var, ThreadPool& pool, T* relu_out) {
  const int64_t N = a.n, C = a.c, I = a.inner;
  const double m = double(N) * double(I);
  const double unbias = m > 1 ? m / (m - 1) : 1.0, mom = a.momentum;
  // Statistics of channels [cb, ce) into mean/rstd (and the running update), then y = x * scale + shift.
  auto finish = [&](int64_t c, double mu, double var) {
    if (a.training) {
      running_mean[c] = static_cast<float>((1.0 - mom) * running_mean[c] + mom * mu);
      running_var[c] = static_cast<float>((1.0 - mom) * running_var[c] + mom * var * unbias);
      mean[c] = static_cast<float>(mu);
      rstd[c] = static_cast<float>(1.0 / std::sqrt(var + double(a.eps)));
    } else {
      mean[c] = running_mean[c];
      rstd[c] = static_cast<float>(1.0 / std::sqrt(double(running_var[c]) + double(a.eps)));
    }
  };
  const bool short_runs = I < kShortRun;
  const int64_t cpb = short_runs ? channels_per_block(I) : 1, blocks = (C + cpb - 1) / cpb;
  parallel_ranges(pool, blocks, parts_for(N * C * I, pool), [&](int64_t bb, int64_t be) {
    for (int64_t b = bb; b < be; ++b) {
      const int64_t cb = b * cpb, ce = std::min(C, cb + cpb), L = (ce - cb) * I;
      if (a.training) {
        if (short_runs) {
          double s[kBlock], q[kBlock];
          float me[kBlock];
          block_sums(
              x, N, C, I, cb, ce, [](float v, int64_t, int64_t) { return v; }, s);
          for (int64_t j = 0; j < L; ++j) me[j] = static_cast<float>(s[j / I] / m);
          block_sums(
              x, N, C, I, cb, ce, [&](float v, int64_t j, int64_t) { return (v - me[j]) * (v - me[j]); }, q);
          for (int64_t k = 0; k < ce - cb; ++k) finish(cb + k, s[k] / m, q[k] / m);
        } else {
          const double mu = channel_sum(x, N, C, I, cb, [](float v, int64_t, int64_t) { return v; }) / m;
          const float mf = static_cast<float>(mu);
          const double var =
              channel_sum(x, N, C, I, cb, [&](float v, int64_t, int64_t) { return (v - mf) * (v - mf); }) / m;
          finish(cb, mu, var);
        }
      } else {
        for (int64_t c = cb; c < ce; ++c) finish(c, 0, 0);
      }
      float scale[kBlock], shift[kBlock];
      if (short_runs) {
        for (int64_t j = 0; j < L; ++j) {
          const int64_t c = cb + j / I;
          scale[j] = rstd[c] * gamma[c];
          shift[j] = beta[c] - mean[c] * scale[j];
        }
        for (int64_t o = 0; o < N; ++o) {
          const T* xr = x + (o * C + cb) * I;
          T* yr = y + (o * C + cb) * I;
          bf16io::store_all(yr, L, [&](int64_t j) { return load(xr[j]) * scale[j] + shift[j]; });
          if (relu_out) relu_of_stored(yr, relu_out + (o * C + cb) * I, L);
        }
      } else {
        const float sc = rstd[cb] * gamma[cb], sh = beta[cb] - mean[cb] * sc;
        for (int64_t o = 0; o < N; ++o) {
          const T* xr = x + (o * C + cb) * I;
          T* yr = y + (o * C + cb) * I;
          if (o + 1 < N) {
            prefetch_run(xr + C * I, I);
            prefetch_run<true>(yr + C * I, I);
            if (relu_out && relu_out != y) prefetch_run<true>(relu_out + (o * C + cb) * I + C * I, I);
          }
          if constexpr (std::is_same_v<T, uint16_t>) {
            if (has_avx512_bf16()) {
              normalize_run_avx512(xr, yr, relu_out ? relu_out + (o * C + cb) * I : nullptr, I, sc, sh);
              continue;
            }
          }
          bf16io::store_all(yr, I, [&](int64_t i) { return load(xr[i]) * sc + sh; });
          if (relu_out) relu_of_stored(yr, relu_out + (o * C + cb) * I, I);
        }
      }
    }
  });
}

}  // namespace

void batch_norm_forward(const BatchNormAttrs& a, const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, float* running_mean, float* running_var, ThreadPool& pool,
                        float* relu_out) {
  forward_impl(a, x, gamma, beta, y, mean, rstd, running_mean, running_var, pool, relu_out);
}

bool batch_norm_long_runs(const BatchNormAttrs& a) { return a.inner >= kShortRun; }

namespace {

// batch_norm_backward, with a ReLU's backward in front when relu (long runs only): dy is then written to relu_dy
// (the same buffer as dy) by the statistics sweep before the dx pass reads it.
template <class T>
void backward_impl(const BatchNormAttrs& a, const T* x, const float* gamma, const float* mean, const float* rstd,
                   const T* dy, const ReluInFrontT<T>* relu, T* relu_dy, T* dx, float* dgamma, float* dbeta,
                   ThreadPool& pool) {
  const int64_t N = a.n, C = a.c, I = a.inner;
  const double m = double(N) * double(I);
  const bool short_runs = I < kShortRun;
  const int64_t cpb = short_runs ? channels_per_block(I) : 1, blocks = (C + cpb - 1) / cpb;
  parallel_ranges(pool, blocks, parts_for(N * C * I, pool), [&](int64_t bb, int64_t be) {
    for (int64_t b = bb; b < be; ++b) {
      const int64_t cb = b * cpb, ce = std::min(C, cb + cpb), L = (ce - cb) * I;
      double sdy[kBlock], sdyx[kBlock];
      // dy and dy * xhat summed per channel; dy is read at the same offset as x.
      if (short_runs) {
        float me[kBlock], rs[kBlock];
        for (int64_t j = 0; j < L; ++j) me[j] = mean[cb + j / I], rs[j] = rstd[cb + j / I];
        const int64_t base = cb * I;
        block_sums(
            dy, N, C, I, cb, ce, [](float v, int64_t, int64_t) { return v; }, sdy);
        block_sums(
            dy, N, C, I, cb, ce,
            [&](float v, int64_t j, int64_t o) { return v * (load(x[o * C * I + base + j]) - me[j]) * rs[j]; }, sdyx);
      } else {
        channel_sums_backward(dy, relu, relu_dy, x, N, C, I, cb, mean[cb], rstd[cb], sdy[0], sdyx[0]);
      }
      float k1[kBlock], k2[kBlock], k3[kBlock], me[kBlock];  // dx = k1 * dy - k2 * (x - mean) - k3
      const int64_t lanes = short_runs ? L : 1, per = short_runs ? I : 1;
      for (int64_t j = 0; j < lanes; ++j) {
        const int64_t k = j / per, c = cb + k;
        const double ga = gamma[c], r = rstd[c];
        const double mg = a.training && m > 0 ? ga * sdy[k] / m : 0.0,
                     mgx = a.training && m > 0 ? ga * sdyx[k] / m : 0.0;
        k1[j] = static_cast<float>(r * ga);
        k2[j] = static_cast<float>(r * r * mgx);
        k3[j] = static_cast<float>(r * mg);
        me[j] = mean[c];
      }
      for (int64_t k = 0; k < ce - cb; ++k) {
        dgamma[cb + k] = static_cast<float>(sdyx[k]);
        dbeta[cb + k] = static_cast<float>(sdy[k]);
      }
      for (int64_t o = 0; o < N; ++o) {
        const int64_t off = (o * C + cb) * I;
        const T* xr = x + off;
        const T* dyr = dy + off;
        T* dxr = dx + off;
        if (short_runs) {
          bf16io::store_all(dxr, L,
                            [&](int64_t j) { return k1[j] * load(dyr[j]) - k2[j] * (load(xr[j]) - me[j]) - k3[j]; });
        } else {
          const float c1 = k1[0], c2 = k2[0], c3 = k3[0], mu = me[0];
          if (o + 1 < N) {
            prefetch_run(xr + C * I, I);
            prefetch_run(dyr + C * I, I);
            if (dx != dy) prefetch_run<true>(dxr + C * I, I);
          }
          if constexpr (std::is_same_v<T, uint16_t>) {
            if (has_avx512_bf16()) {
              dx_run_avx512(dyr, xr, dxr, I, c1, c2, c3, mu);
              continue;
            }
          }
          bf16io::store_all(dxr, I, [&](int64_t i) { return c1 * load(dyr[i]) - c2 * (load(xr[i]) - mu) - c3; });
        }
      }
    }
  });
}

void batch_norm_backward(const BatchNormAttrs& a, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta, ThreadPool& pool) {
  backward_impl<float>(a, x, gamma, mean, rstd, dy, nullptr, nullptr, dx, dgamma, dbeta, pool);
}

// Activations (x, y / x, dy, dx) all float32 or all bf16; gamma, beta, the statistics and the parameter gradients
// float32 (the mixed-precision policy keeps them so).
bool same_activations(const OpCall& c, std::initializer_list<const BufferView*> acts) {
  const DType t = (*acts.begin())->dtype;
  if (t != DType::f32 && t != DType::bf16) return false;
  for (const BufferView* v : acts)
    if (v->dtype != t) return false;
  for (const auto* list : {&c.in, &c.out})
    for (const auto& v : *list)
      if (std::find(acts.begin(), acts.end(), &v) == acts.end() && v.dtype != DType::f32) return false;
  return true;
}
bool forward_takes(const OpCall& c) { return same_activations(c, {&c.in[0], &c.out[0]}); }
bool backward_takes(const OpCall& c) { return same_activations(c, {&c.in[0], &c.in[4], &c.out[0]}); }

const uint16_t* bf16_in(const OpCall& c, size_t i) { return static_cast<const uint16_t*>(c.in[i].raw()); }
uint16_t* bf16_out(const OpCall& c, size_t i) { return static_cast<uint16_t*>(c.out[i].raw()); }

}  // namespace

void batch_norm_backward_relu(const BatchNormAttrs& a, const float* x, const float* gamma, const float* mean,
                              const float* rstd, const ReluInFront& r, float* dy, float* dx, float* dgamma,
                              float* dbeta, ThreadPool& pool) {
  if (!batch_norm_long_runs(a)) throw std::logic_error("batch_norm_backward_relu: short runs are not fused");
  backward_impl(a, x, gamma, mean, rstd, dy, &r, dy, dx, dgamma, dbeta, pool);
}

void batch_norm_forward_bf16(const BatchNormAttrs& a, const uint16_t* x, const float* gamma, const float* beta,
                             uint16_t* y, float* mean, float* rstd, float* running_mean, float* running_var,
                             ThreadPool& pool, uint16_t* relu_out) {
  forward_impl(a, x, gamma, beta, y, mean, rstd, running_mean, running_var, pool, relu_out);
}

void batch_norm_backward_relu_bf16(const BatchNormAttrs& a, const uint16_t* x, const float* gamma, const float* mean,
                                   const float* rstd, const ReluInFrontT<uint16_t>& r, uint16_t* dy, uint16_t* dx,
                                   float* dgamma, float* dbeta, ThreadPool& pool) {
  if (!batch_norm_long_runs(a)) throw std::logic_error("batch_norm_backward_relu_bf16: short runs are not fused");
  backward_impl(a, x, gamma, mean, rstd, dy, &r, dy, dx, dgamma, dbeta, pool);
}

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("batch_norm_forward",
                {[](CpuDevice& d, const OpCall& c) {
                   if (c.in[0].dtype == DType::bf16) {
                     batch_norm_forward_bf16(attrs<BatchNormAttrs>(c), bf16_in(c, 0), in(c, 1), in(c, 2),
                                             bf16_out(c, 0), out(c, 1), out(c, 2), out(c, 3), out(c, 4), d.pool());
                     return;
                   }
                   batch_norm_forward(attrs<BatchNormAttrs>(c), in(c, 0), in(c, 1), in(c, 2), out(c, 0), out(c, 1),
                                      out(c, 2), out(c, 3), out(c, 4), d.pool());
                 },
                 nullptr, nullptr, forward_takes});
KILN_CPU_KERNEL("batch_norm_backward", {[](CpuDevice& d, const OpCall& c) {
                                          if (c.in[0].dtype == DType::bf16) {
                                            backward_impl<uint16_t>(attrs<BatchNormAttrs>(c), bf16_in(c, 0), in(c, 1),
                                                                    in(c, 2), in(c, 3), bf16_in(c, 4), nullptr, nullptr,
                                                                    bf16_out(c, 0), out(c, 1), out(c, 2), d.pool());
                                            return;
                                          }
                                          batch_norm_backward(attrs<BatchNormAttrs>(c), in(c, 0), in(c, 1), in(c, 2),
                                                              in(c, 3), in(c, 4), out(c, 0), out(c, 1), out(c, 2),
                                                              d.pool());
                                        },
                                        nullptr, nullptr, backward_takes});

}  // namespace kiln::cpu
