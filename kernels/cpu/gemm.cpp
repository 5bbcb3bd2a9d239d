// GEMM through oneDNN's sgemm where the plugin is built with oneDNN (KILN_WITH_DNNL), else OpenBLAS's. Either is
// kept single-threaded and the product is split across the device's thread pool: their own threads would otherwise
// fight ours for the same cores (measured in bench/results/cpu_ops.md), and one thread model keeps the `threads`
// option exact. oneDNN's: single-threaded on an AVX-512 host it ran these shapes at 109-117 GFLOP/s against
// OpenBLAS's 88-106, and it has no counterpart of OpenBLAS's slow state (cpu_ops.md), which a process can enter
// for good despite the warm-up below. KILN_CPU_GEMM=openblas keeps OpenBLAS (to measure it, or rule it out).
#include <cblas.h>

#ifdef KILN_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "one_omp_thread.hpp"
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "gemm.hpp"

namespace kiln::cpu {

namespace {

bool use_dnnl_gemm() {
#ifdef KILN_WITH_DNNL
  static const bool on = [] {
    const char* e = std::getenv("KILN_CPU_GEMM");
    return !(e && std::strcmp(e, "openblas") == 0);
  }();
  return on;
#else
  return false;
#endif
}

}  // namespace

void blas_init() { openblas_set_num_threads(1); }

void blas_warm_up(ThreadPool& pool) {
  if (use_dnnl_gemm()) return;  // OpenBLAS runs no GEMM then
  if (const char* e = std::getenv("KILN_OPENBLAS_WARMUP"); e && std::strcmp(e, "0") == 0) return;
  pool.run(4 * static_cast<int64_t>(pool.size()), [](int64_t, int) {
    constexpr int64_t m = 256, n = 512, k = 200;
    std::vector<float> a(m * k, 1.f), b(k * n, 1.f), c(m * n);
    sgemm_1t(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
  });
}

void sgemm_1t(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // BLAS rejects lda = 0; y = beta * y without reading y when beta == 0
    for (int64_t i = 0; i < m; ++i) {
      float* row = C + i * ldc;
      if (beta == 0.f)
        std::fill(row, row + n, 0.f);
      else
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
    return;
  }
#ifdef KILN_WITH_DNNL
  if (use_dnnl_gemm()) {
    const OneOmpThread one;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success)
      return;  // else (never seen): OpenBLAS computes it
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

void gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool) {
  const int64_t m = a.m, n = a.n, k = a.k;
  const int64_t lda = a.trans_a ? m : k, ldb = a.trans_b ? k : n;
  // Below ~1 MFLOP waking a worker costs more than the second core gives.
  const double flops = 2.0 * double(m) * double(n) * double(k);
  if (pool.size() <= 1 || flops < 1.0e6 || k == 0) {
    sgemm_1t(a.trans_a, a.trans_b, m, n, k, a.alpha, A, lda, B, ldb, a.beta, y, n);
    return;
  }
  // Split the larger output dimension into one contiguous slab per thread, rounded to the micro-kernel tile.
  const bool split_rows = m >= n;
  const int64_t dim = split_rows ? m : n;
  const int64_t tile = split_rows ? 8 : 16;
  const int64_t parts = std::min<int64_t>(pool.size(), std::max<int64_t>(1, dim / tile));
  const int64_t chunk = ((dim + parts - 1) / parts + tile - 1) / tile * tile;
  pool.run(parts, [&](int64_t p, int) {
    const int64_t b = p * chunk, e = std::min(dim, b + chunk);
    if (b >= e) return;
    if (split_rows) {
      const float* As = a.trans_a ? A + b : A + b * k;
      sgemm_1t(a.trans_a, a.trans_b, e - b, n, k, a.alpha, As, lda, B, ldb, a.beta, y + b * n, n);
    } else {
      const float* Bs = a.trans_b ? B + b * k : B + b;
      sgemm_1t(a.trans_a, a.trans_b, m, e - b, k, a.alpha, A, lda, Bs, ldb, a.beta, y + b, n);
    }
  });
}

// ---- registration ---------------------------------------------------------------------------------------------

namespace {
// BLAS takes 32-bit dimensions.
Support blas_dims(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d > std::numeric_limits<int>::max())
      return {false, "a dimension of " + std::to_string(d) + " exceeds what BLAS can index (2^31 - 1)"};
  return {};
}
}  // namespace

Support gemm_supports(OpKind, const OpAttrs& a) {
  const auto& g = std::get<GemmAttrs>(a);
  return blas_dims({g.m, g.n, g.k});
}
Support conv_supports(OpKind, const OpAttrs& a) {
  const auto& c = std::get<ConvAttrs>(a);
  return blas_dims({c.k, c.c * c.r * c.s, c.oh * c.ow});
}

KILN_CPU_KERNEL("gemm", {[](CpuDevice& d, const OpCall& c) {
                           cpu::gemm(attrs<GemmAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                         },
                         gemm_supports});

}  // namespace kiln::cpu
