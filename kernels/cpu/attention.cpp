// The ops attention is built from: batched GEMM (one OpenBLAS call per matrix, the batch spread over the pool's
// threads) and axis permutation (contiguous runs copied whole). Causal softmax lives with softmax (softmax.cpp).
#include <algorithm>
#include <cstring>

#include "cpu_kernel.hpp"
#include "gemm.hpp"
#include "thread_pool.hpp"

namespace kiln::cpu {
namespace {

void batched_gemm(const GemmAttrs& a, const float* A, const float* B, float* y, ThreadPool& pool) {
  const int64_t batch = a.batch, m = a.m, n = a.n, k = a.k;
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const int64_t sa = m * k, sb = k * n, sy = m * n;
  // Few large matrices: each product split across the threads (gemm's own split). Otherwise whole matrices per
  // thread: attention's are small (64 x 64 x 32 in nanoGPT's model), and one call each keeps OpenBLAS's packing
  // amortized over the whole product.
  if (batch < pool.size()) {
    GemmAttrs one = a;
    one.batch = 1;
    for (int64_t b = 0; b < batch; ++b) gemm(one, A + b * sa, B + b * sb, y + b * sy, pool);
    return;
  }
  const int64_t lda = a.trans_a ? m : k, ldb = a.trans_b ? k : n;
  const double flops = 2.0 * double(batch) * double(m) * double(n) * double(k);
  const int64_t parts = flops < 1.0e6 ? 1 : std::min<int64_t>(batch, 4 * int64_t{pool.size()});
  parallel_ranges(pool, batch, parts, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      sgemm_1t(a.trans_a, a.trans_b, m, n, k, a.alpha, A + b * sa, lda, B + b * sb, ldb, a.beta, y + b * sy, n);
  });
}

template <class E>  // the element type: float, or uint16_t for any 16-bit storage (values moved as bits)
void permute(const PermuteAttrs& a, const E* x, E* y, ThreadPool& pool) {
  const int r = static_cast<int>(a.rank);
  int64_t xstride[kPermuteMaxRank], ydims[kPermuteMaxRank], ystep[kPermuteMaxRank], total = 1;
  int64_t s = 1;
  for (int i = r - 1; i >= 0; --i) xstride[i] = s, s *= a.dims[i];
  for (int i = 0; i < r; ++i) ydims[i] = a.dims[a.perm[i]], ystep[i] = xstride[a.perm[i]], total *= a.dims[i];
  if (total == 0) return;
  // y's last axis, when it is x's last axis too, is a contiguous run copied whole; the other axes are walked
  // as an odometer over y's rows, each row's source found by adding strides (no division per element).
  const bool run = a.perm[r - 1] == r - 1;
  const int outer_rank = run ? r - 1 : r;
  const int64_t len = run ? ydims[r - 1] : 1;
  const int64_t rows = total / len;
  parallel_ranges(pool, rows, parts_for(total, pool), [&](int64_t rb, int64_t re) {
    int64_t idx[kPermuteMaxRank] = {};
    int64_t src = 0;
    for (int64_t rest = rb, i = outer_rank - 1; i >= 0; --i) {
      idx[i] = rest % ydims[i];
      rest /= ydims[i];
      src += idx[i] * ystep[i];
    }
    for (int64_t row = rb; row < re; ++row) {
      if (run) {
        // Attention's runs are a head's 32-128 values: a call to memcpy per run cost more than the copy (the GPT
        // sample's permutes moved 4 GB/s); an inline loop vectorizes.
        E* yr = y + row * len;
        const E* xr = x + src;
        if (len <= 256) {
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) yr[j] = xr[j];
        } else {
          std::memcpy(yr, xr, static_cast<size_t>(len) * sizeof(E));
        }
      } else {
        y[row] = x[src];
      }
      for (int i = outer_rank - 1; i >= 0; --i) {  // next row of y
        src += ystep[i];
        if (++idx[i] < ydims[i]) break;
        src -= idx[i] * ystep[i];
        idx[i] = 0;
      }
    }
  });
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------------------------

KILN_CPU_KERNEL("batched_gemm", {[](CpuDevice& d, const OpCall& c) {
                                   const auto& a = attrs<GemmAttrs>(c);
                                   // Converted calls keep their empty views' types: positive sizes mean a native one.
                                   if (c.in[0].dtype == DType::bf16 && a.batch > 0 && a.m > 0 && a.n > 0 && a.k > 0)
                                     batched_gemm_bf16(d, c);  // gemm.cpp, where batched_gemm_bf16_takes said yes
                                   else
                                     cpu::batched_gemm(attrs<GemmAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool());
                                 },
                                 gemm_supports,
                                 [](const CpuDevice& d, const OpCall& c) {
                                   return c.in[0].dtype == DType::bf16 ? batched_gemm_bf16_workspace(d, c) : size_t{0};
                                 },
                                 [](const OpCall& c) {
                                   const bool f32 = c.in[0].dtype == DType::f32 && c.in[1].dtype == DType::f32 &&
                                                    c.out[0].dtype == DType::f32;
                                   return f32 || batched_gemm_bf16_takes(c);
                                 }});
KILN_CPU_KERNEL("permute", {[](CpuDevice& d, const OpCall& c) {
                              if (c.in[0].dtype == DType::f32)
                                cpu::permute(attrs<PermuteAttrs>(c), in(c, 0), out(c, 0), d.pool());
                              else
                                cpu::permute(attrs<PermuteAttrs>(c), static_cast<const uint16_t*>(c.in[0].raw()),
                                             static_cast<uint16_t*>(c.out[0].raw()), d.pool());
                            },
                            nullptr, nullptr, [](const OpCall& c) { return c.in[0].dtype == c.out[0].dtype; }});

}  // namespace kiln::cpu
