// The batch-norm oracle: per channel over (n, inner), double accumulation. Semantics: ops.hpp BatchNormForward.
#include <cmath>
#include <vector>

#include "reference_impl.hpp"

namespace kiln::ref {

// x: (n, c, inner); gamma, beta, mean, rstd, running statistics: (c).
void batch_norm(OpKind kind, const BatchNormAttrs& a, In in, Out out) {
  const int64_t N = a.n, C = a.c, I = a.inner;
  const double m = double(N) * double(I);
  const float* x = in[0];
  const float* gamma = in[1];
  if (kind == OpKind::BatchNormForward) {
    const float* beta = in[2];
    float *y = out[0], *mean_out = out[1], *rstd_out = out[2], *run_mean = out[3], *run_var = out[4];
    for (int64_t c = 0; c < C; ++c) {
      double mean, rstd;
      if (a.training) {
        double sum = 0;
        for (int64_t o = 0; o < N; ++o)
          for (int64_t i = 0; i < I; ++i) sum += x[(o * C + c) * I + i];
        mean = m > 0 ? sum / m : 0.0;
        double sq = 0;
        for (int64_t o = 0; o < N; ++o)
          for (int64_t i = 0; i < I; ++i) {
            const double d = x[(o * C + c) * I + i] - mean;
            sq += d * d;
          }
        const double var = m > 0 ? sq / m : 0.0;
        rstd = 1.0 / std::sqrt(var + double(a.eps));
        const double mom = a.momentum;
        const double unbiased = m > 1 ? var * m / (m - 1) : var;
        run_mean[c] = static_cast<float>((1.0 - mom) * run_mean[c] + mom * mean);
        run_var[c] = static_cast<float>((1.0 - mom) * run_var[c] + mom * unbiased);
      } else {
        mean = run_mean[c];
        rstd = 1.0 / std::sqrt(double(run_var[c]) + double(a.eps));
      }
      for (int64_t o = 0; o < N; ++o)
        for (int64_t i = 0; i < I; ++i) {
          const int64_t j = (o * C + c) * I + i;
          y[j] = static_cast<float>((x[j] - mean) * rstd * gamma[c] + beta[c]);
        }
      mean_out[c] = static_cast<float>(mean);
      rstd_out[c] = static_cast<float>(rstd);
    }
    return;
  }
  const float *mean = in[2], *rstd = in[3], *dy = in[4];
  float *dx = out[0], *dgamma = out[1], *dbeta = out[2];
  for (int64_t c = 0; c < C; ++c) {
    const double mu = mean[c], rs = rstd[c], ga = gamma[c];
    double sdy = 0, sdyx = 0;
    for (int64_t o = 0; o < N; ++o)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t j = (o * C + c) * I + i;
        sdy += dy[j];
        sdyx += double(dy[j]) * (x[j] - mu) * rs;
      }
    // mean(g) = gamma * mean(dy), mean(g * xhat) = gamma * mean(dy * xhat).
    const double mg = a.training && m > 0 ? ga * sdy / m : 0.0, mgx = a.training && m > 0 ? ga * sdyx / m : 0.0;
    for (int64_t o = 0; o < N; ++o)
      for (int64_t i = 0; i < I; ++i) {
        const int64_t j = (o * C + c) * I + i;
        const double xhat = (x[j] - mu) * rs;
        dx[j] = static_cast<float>(rs * (double(dy[j]) * ga - mg - xhat * mgx));
      }
    dgamma[c] = static_cast<float>(sdyx);
    dbeta[c] = static_cast<float>(sdy);
  }
}

}  // namespace kiln::ref
