// The naive oracle for images (conv, pooling), activations, softmax and the fused losses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference_impl.hpp"

namespace kiln::ref {

void conv2d(OpKind kind, const ConvAttrs& a, In in, Out out) {
  // x: (n, c, h, w), w: (k, c, r, s), y: (n, k, oh, ow)
  auto xi = [&](int64_t n, int64_t c, int64_t y, int64_t x) { return ((n * a.c + c) * a.h + y) * a.w + x; };
  auto wi = [&](int64_t k, int64_t c, int64_t r, int64_t s) { return ((k * a.c + c) * a.r + r) * a.s + s; };
  auto yi = [&](int64_t n, int64_t k, int64_t y, int64_t x) { return ((n * a.k + k) * a.oh + y) * a.ow + x; };
  // Calls f(n, k, oy, ox, c, r, s, iy, ix) for every in-image tap of the convolution.
  auto each_tap = [&](auto&& f) {
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t k = 0; k < a.k; ++k)
        for (int64_t oy = 0; oy < a.oh; ++oy)
          for (int64_t ox = 0; ox < a.ow; ++ox)
            for (int64_t c = 0; c < a.c; ++c)
              for (int64_t r = 0; r < a.r; ++r)
                for (int64_t s = 0; s < a.s; ++s) {
                  const int64_t iy = oy * a.stride_h - a.pad_h + r, ix = ox * a.stride_w - a.pad_w + s;
                  if (iy >= 0 && iy < a.h && ix >= 0 && ix < a.w) f(n, k, oy, ox, c, r, s, iy, ix);
                }
  };
  if (kind == OpKind::Conv2dForward) {
    const float* x = in[0];
    const float* w = in[1];
    std::vector<double> acc(static_cast<size_t>(a.n * a.k * a.oh * a.ow), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[yi(n, k, oy, ox)] += double(x[xi(n, c, iy, ix)]) * w[wi(k, c, r, s)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  } else if (kind == OpKind::Conv2dBackwardData) {
    const float* dy = in[0];
    const float* w = in[1];
    std::vector<double> acc(static_cast<size_t>(a.n * a.c * a.h * a.w), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[xi(n, c, iy, ix)] += double(dy[yi(n, k, oy, ox)]) * w[wi(k, c, r, s)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  } else {
    const float* x = in[0];
    const float* dy = in[1];
    std::vector<double> acc(static_cast<size_t>(a.k * a.c * a.r * a.s), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[wi(k, c, r, s)] += double(x[xi(n, c, iy, ix)]) * dy[yi(n, k, oy, ox)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  }
}

void pool(OpKind kind, const PoolAttrs& a, In in, Out out) {
  const bool forward = kind == OpKind::MaxPoolForward || kind == OpKind::AvgPoolForward;
  float* dst = out[0];
  if (!forward) std::fill(dst, dst + a.n * a.c * a.h * a.w, 0.0f);
  for (int64_t p = 0; p < a.n * a.c; ++p) {  // one (n, c) plane at a time
    const int64_t xoff = p * a.h * a.w, yoff = p * a.oh * a.ow;
    for (int64_t oy = 0; oy < a.oh; ++oy)
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const int64_t y0 = std::max<int64_t>(oy * a.stride_h - a.pad_h, 0);
        const int64_t y1 = std::min<int64_t>(oy * a.stride_h - a.pad_h + a.kh, a.h);
        const int64_t x0 = std::max<int64_t>(ox * a.stride_w - a.pad_w, 0);
        const int64_t x1 = std::min<int64_t>(ox * a.stride_w - a.pad_w + a.kw, a.w);
        const int64_t o = yoff + oy * a.ow + ox;
        const int64_t count = std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0);
        if (kind == OpKind::MaxPoolForward) {
          float best = 0.0f;
          bool found = false;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) {
              const float v = in[0][xoff + iy * a.w + ix];
              if (!found || v > best) best = v;
              found = true;
            }
          dst[o] = best;
        } else if (kind == OpKind::MaxPoolBackward) {
          const float* x = in[0];
          const float yv = in[1][o];
          bool done = false;
          for (int64_t iy = y0; iy < y1 && !done; ++iy)
            for (int64_t ix = x0; ix < x1 && !done; ++ix)
              if (x[xoff + iy * a.w + ix] == yv) {
                dst[xoff + iy * a.w + ix] += in[2][o];
                done = true;
              }
        } else if (kind == OpKind::AvgPoolForward) {
          double acc = 0;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) acc += in[0][xoff + iy * a.w + ix];
          dst[o] = count > 0 ? static_cast<float>(acc / double(count)) : 0.0f;
        } else if (count > 0) {
          const float g = static_cast<float>(double(in[0][o]) / double(count));
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) dst[xoff + iy * a.w + ix] += g;
        }
      }
  }
}

void activation(OpKind kind, const ActivationAttrs& a, In in, Out out) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588, kInvSqrt2 = 0.70710678118654752440,
                   kInvSqrt2Pi = 0.39894228040143267794;
  for (int64_t i = 0; i < a.count; ++i) {
    if (kind == OpKind::ActivationForward) {
      const double x = in[0][i];
      double y = 0;
      switch (a.act) {
        case Activation::relu:
          y = x < 0 ? 0.0 : x;
          break;  // NaN passes through
        case Activation::sigmoid:
          y = 1.0 / (1.0 + std::exp(-x));
          break;
        case Activation::tanh:
          y = std::tanh(x);
          break;
        case Activation::gelu:
          y = 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
          break;
        case Activation::gelu_tanh:
          y = 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
          break;
        case Activation::silu:
          y = x / (1.0 + std::exp(-x));
          break;
      }
      out[0][i] = static_cast<float>(y);
    } else {
      const double v = in[0][i], dy = in[1][i];  // v: y, or x where activation_backward_reads_input
      double dx = 0;
      switch (a.act) {
        case Activation::relu:
          dx = v > 0 ? dy : 0.0;
          break;
        case Activation::sigmoid:
          dx = dy * v * (1.0 - v);
          break;
        case Activation::tanh:
          dx = dy * (1.0 - v * v);
          break;
        case Activation::gelu:
          dx = dy * (0.5 * (1.0 + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v));
          break;
        case Activation::gelu_tanh: {
          const double t = std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v));
          dx = dy * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * v * v));
          break;
        }
        case Activation::silu: {
          const double s = 1.0 / (1.0 + std::exp(-v));
          dx = dy * s * (1.0 + v * (1.0 - s));
          break;
        }
      }
      out[0][i] = static_cast<float>(dx);
    }
  }
}

void layer_norm(OpKind kind, const LayerNormAttrs& a, In in, Out out) {
  const int64_t rows = a.rows, cols = a.cols;
  const float* gamma = in[1];
  if (kind == OpKind::LayerNormForward) {
    const float* beta = a.bias ? in[2] : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in[0] + r * cols;
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += x[c];
      const double mean = cols ? sum / double(cols) : 0.0;
      double sq = 0;
      for (int64_t c = 0; c < cols; ++c) sq += (x[c] - mean) * (x[c] - mean);
      const double rstd = 1.0 / std::sqrt((cols ? sq / double(cols) : 0.0) + double(a.eps));
      for (int64_t c = 0; c < cols; ++c) {
        double y = (x[c] - mean) * rstd * gamma[c];
        if (beta) y += beta[c];
        out[0][r * cols + c] = static_cast<float>(y);
      }
      out[1][r] = static_cast<float>(mean);
      out[2][r] = static_cast<float>(rstd);
    }
    return;
  }
  const float *mean = in[2], *rstd = in[3];
  std::vector<double> dgamma(static_cast<size_t>(cols)), dbeta(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0] + r * cols;
    const float* dy = in[4] + r * cols;
    const double m = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * rs, g = double(dy[c]) * gamma[c];
      sg += g;
      sgx += g * xhat;
      dgamma[size_t(c)] += double(dy[c]) * xhat;
      dbeta[size_t(c)] += dy[c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[c] - m) * rs, g = double(dy[c]) * gamma[c];
      out[0][r * cols + c] = static_cast<float>(rs * (g - sg / double(cols) - xhat * sgx / double(cols)));
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    out[1][c] = static_cast<float>(dgamma[size_t(c)]);
    if (a.bias) out[2][c] = static_cast<float>(dbeta[size_t(c)]);
  }
}

void softmax(OpKind kind, const SoftmaxAttrs& a, In in, Out out) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t off = r * a.cols;
    if (kind == OpKind::SoftmaxForward) {
      const float* x = in[0] + off;
      const int64_t valid = a.causal && a.cols > 0 ? r % a.cols + 1 : a.cols;  // causal: columns after r % cols are masked
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < valid; ++j) mx = std::max<double>(mx, x[j]);
      double sum = 0;
      for (int64_t j = 0; j < valid; ++j) sum += std::exp(double(x[j]) - mx);
      for (int64_t j = 0; j < valid; ++j) out[0][off + j] = static_cast<float>(std::exp(double(x[j]) - mx) / sum);
      for (int64_t j = valid; j < a.cols; ++j) out[0][off + j] = 0.f;
    } else {
      const float* y = in[0] + off;
      const float* dy = in[1] + off;
      double dot = 0;
      for (int64_t j = 0; j < a.cols; ++j) dot += double(dy[j]) * y[j];
      for (int64_t j = 0; j < a.cols; ++j) out[0][off + j] = static_cast<float>(double(y[j]) * (dy[j] - dot));
    }
  }
}

void loss(OpKind kind, const LossAttrs& a, In in, Out out) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double total = 0;
  if (kind == OpKind::SoftmaxCrossEntropy) {
    for (int64_t r = 0; r < a.rows; ++r) {
      const float* x = in[0] + r * a.cols;
      float* dx = out[1] + r * a.cols;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < a.cols; ++j) mx = std::max<double>(mx, x[j]);
      double sum = 0;
      for (int64_t j = 0; j < a.cols; ++j) sum += std::exp(double(x[j]) - mx);
      const double lse = mx + std::log(sum);
      if (a.soft_labels) {
        const float* t = in[1] + r * a.cols;
        double tsum = 0;
        for (int64_t j = 0; j < a.cols; ++j) tsum += t[j], total += double(t[j]) * (lse - x[j]);
        for (int64_t j = 0; j < a.cols; ++j)
          dx[j] = static_cast<float>(a.scale * (std::exp(double(x[j]) - lse) * tsum - double(t[j])));
        continue;
      }
      const float lf = in[1][r];
      const bool ok = lf >= 0.0f && lf < static_cast<float>(a.cols);
      const int64_t label = ok ? static_cast<int64_t>(lf) : -1;
      total += ok ? lse - x[label] : nan;
      for (int64_t j = 0; j < a.cols; ++j)
        dx[j] = static_cast<float>(a.scale * (std::exp(double(x[j]) - lse) - (j == label ? 1.0 : 0.0)));
    }
    out[0][0] = static_cast<float>(a.scale * total);
    return;
  }
  const double per = a.cols > 0 ? double(a.scale) / double(a.cols) : 0.0;
  const int64_t n = a.rows * a.cols;
  for (int64_t i = 0; i < n; ++i) {
    const double p = in[0][i], t = in[1][i];
    double g = 0;
    if (kind == OpKind::MeanSquaredError) {
      total += (p - t) * (p - t);
      g = 2.0 * (p - t);
    } else if (a.from_logits) {
      total += std::max(p, 0.0) - p * t + std::log1p(std::exp(-std::abs(p)));
      g = 1.0 / (1.0 + std::exp(-p)) - t;
    } else {
      const double pc = std::clamp(p, 1e-7, 1.0 - 1e-7);
      total += -(t * std::log(pc) + (1.0 - t) * std::log(1.0 - pc));
      g = (pc - t) / (pc * (1.0 - pc));
    }
    out[1][i] = static_cast<float>(per * g);
  }
  out[0][0] = static_cast<float>(per * total);
}

}  // namespace kiln::ref
