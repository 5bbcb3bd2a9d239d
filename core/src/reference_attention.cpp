// The oracles of the ops attention is built from: batched GEMM and axis permutation (causal softmax is
// reference_nn.cpp's softmax). Naive loops in double, as every reference.
#include "reference_impl.hpp"

namespace kiln::ref {

void batched_gemm(const GemmAttrs& a, In in, Out out) {
  const int64_t sa = a.m * a.k, sb = a.k * a.n, sy = a.m * a.n;
  for (int64_t b = 0; b < a.batch; ++b) {
    const float* A = in[0] + b * sa;
    const float* B = in[1] + b * sb;
    float* y = out[0] + b * sy;
    for (int64_t i = 0; i < a.m; ++i)
      for (int64_t j = 0; j < a.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < a.k; ++p) {
          const double av = a.trans_a ? A[p * a.m + i] : A[i * a.k + p];
          const double bv = a.trans_b ? B[j * a.k + p] : B[p * a.n + j];
          acc += av * bv;
        }
        double r = double(a.alpha) * acc;
        if (a.beta != 0.f) r += double(a.beta) * y[i * a.n + j];  // y is not read when beta == 0
        y[i * a.n + j] = static_cast<float>(r);
      }
  }
}

void permute(const PermuteAttrs& a, In in, Out out) {
  const int64_t r = a.rank;
  int64_t xstride[kPermuteMaxRank], ydims[kPermuteMaxRank], n = 1;
  for (int64_t i = r - 1, s = 1; i >= 0; --i) xstride[i] = s, s *= a.dims[i];
  for (int64_t i = 0; i < r; ++i) ydims[i] = a.dims[a.perm[i]], n *= a.dims[i];
  for (int64_t o = 0; o < n; ++o) {
    int64_t rest = o, src = 0;
    for (int64_t i = r - 1; i >= 0; --i) {  // y's index, last axis fastest, mapped to x's offset
      src += (rest % ydims[i]) * xstride[a.perm[i]];
      rest /= ydims[i];
    }
    out[0][o] = in[0][src];
  }
}

}  // namespace kiln::ref
