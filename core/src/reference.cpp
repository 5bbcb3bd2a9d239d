// The naive oracle of the op set: dense algebra, elementwise, reductions, dropout, optimizers.
// Images, activations, softmax and losses are in reference_nn.cpp. Semantics: core/include/kiln/ops.hpp.
#include "kiln/reference.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/op_table.hpp"
#include "reference_impl.hpp"

namespace kiln::ref {

void gemm(const GemmAttrs& a, In in, Out out) {
  const float* A = in[0];
  const float* B = in[1];
  float* y = out[0];
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

void bias_add(const BiasAttrs& a, In in, Out out) {
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t c = 0; c < a.channels; ++c)
      for (int64_t i = 0; i < a.inner; ++i) {
        const int64_t idx = (o * a.channels + c) * a.inner + i;
        out[0][idx] = in[0][idx] + in[1][c];
      }
}

void bias_grad(const BiasAttrs& a, In in, Out out) {
  for (int64_t c = 0; c < a.channels; ++c) {
    double acc = 0;
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t i = 0; i < a.inner; ++i) acc += in[0][(o * a.channels + c) * a.inner + i];
    out[0][c] = static_cast<float>(acc);
  }
}

// Elementwise ops read element i of every input before writing element i, so the allowed aliasing is safe.
void elementwise(OpKind k, const ElementwiseAttrs& a, In in, Out out) {
  float* y = out[0];
  for (int64_t i = 0; i < a.count; ++i) {
    switch (k) {
      case OpKind::Add:
        y[i] = a.alpha * in[0][i] + a.beta * in[1][i];
        break;
      case OpKind::Mul:
        y[i] = in[0][i] * in[1][i];
        break;
      case OpKind::Axpby:
        y[i] = a.alpha * in[0][i] + a.beta * y[i];
        break;
      case OpKind::Scale:
        y[i] = a.alpha * in[0][i];
        break;
      case OpKind::Fill:
        y[i] = a.alpha;
        break;
      case OpKind::Copy:
        y[i] = in[0][i];
        break;
      default:
        break;
    }
  }
}

void reduce_sum(const ReduceAttrs& a, In in, Out out) {
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double acc = 0;
      for (int64_t r = 0; r < a.reduce; ++r) acc += in[0][(o * a.reduce + r) * a.inner + i];
      out[0][o * a.inner + i] = static_cast<float>(acc);
    }
}

// Concat copies x_j into y; Split copies y back into x_j. `whole` is y, `parts` the x_j.
void concat_split(bool concat, const ConcatAttrs& a, In in, Out out) {
  int64_t total = 0;
  for (int64_t s : a.sizes) total += s;
  int64_t start = 0;  // first row of part j inside y
  for (size_t j = 0; j < a.sizes.size(); ++j) {
    const int64_t rows = a.sizes[j];
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < a.inner; ++i) {
          const int64_t w = (o * total + start + r) * a.inner + i;
          const int64_t p = (o * rows + r) * a.inner + i;
          if (concat)
            out[0][w] = in[j][p];
          else
            out[j][p] = in[0][w];
        }
    start += rows;
  }
}

void dropout(const DropoutAttrs& a, In in, Out out) {
  for (int64_t i = 0; i < a.count; ++i) {
    const bool keep = dropout_uniform(a.seed, a.counter, static_cast<uint32_t>(i)) >= a.rate;
    out[0][i] = keep ? in[0][i] / (1.0f - a.rate) : 0.0f;
  }
}

void sgd(const SgdAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* v = out[1];
  for (int64_t i = 0; i < a.count; ++i) {
    const double gp = double(g[i]) + double(a.weight_decay) * w[i];
    double d = gp;
    if (a.momentum != 0.f) {
      const double vn = double(a.momentum) * v[i] + gp;
      v[i] = static_cast<float>(vn);
      d = a.nesterov ? gp + double(a.momentum) * vn : vn;
    }
    w[i] = static_cast<float>(w[i] - double(a.lr) * d);
  }
}

void adam(const AdamAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* m = out[1];
  float* v = out[2];
  const double b1 = a.beta1, b2 = a.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(a.step)), bc2 = 1.0 - std::pow(b2, double(a.step));
  const double keep = 1.0 - double(a.lr) * double(a.decoupled_decay);
  for (int64_t i = 0; i < a.count; ++i) {
    if (a.decoupled_decay != 0.f) w[i] = static_cast<float>(w[i] * keep);
    const double gp = double(g[i]) + double(a.weight_decay) * w[i];
    const double mn = b1 * m[i] + (1.0 - b1) * gp;
    const double vn = b2 * v[i] + (1.0 - b2) * gp * gp;
    m[i] = static_cast<float>(mn);
    v[i] = static_cast<float>(vn);
    w[i] = static_cast<float>(w[i] - double(a.lr) * (mn / bc1) / (std::sqrt(vn / bc2) + double(a.eps)));
  }
}

void rmsprop(const RmspropAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* sq = out[1];
  float* buf = out[2];
  const double rho = a.rho;
  for (int64_t i = 0; i < a.count; ++i) {
    const double gi = g[i];
    const double sn = rho * sq[i] + (1.0 - rho) * gi * gi;
    sq[i] = static_cast<float>(sn);
    const double step = gi / (std::sqrt(sn) + double(a.eps));
    if (a.momentum > 0.f) {
      const double bn = double(a.momentum) * buf[i] + step;
      buf[i] = static_cast<float>(bn);
      w[i] = static_cast<float>(w[i] - double(a.lr) * bn);
    } else {
      w[i] = static_cast<float>(w[i] - double(a.lr) * step);
    }
  }
}

void ema(const EmaAttrs& a, In in, Out out) {
  const double d = a.decay;
  for (int64_t i = 0; i < a.count; ++i) out[0][i] = static_cast<float>(d * out[0][i] + (1.0 - d) * in[0][i]);
}

// An id names a row when it is an integer in [0, vocab); -1 otherwise.
int64_t embedding_row(float id, int64_t vocab) {
  if (!(id >= 0.f) || id != std::floor(id) || id >= static_cast<float>(vocab)) return -1;
  return static_cast<int64_t>(id);
}

void embedding(OpKind k, const EmbeddingAttrs& a, In in, Out out) {
  const float* ids = in[0];
  if (k == OpKind::EmbeddingForward) {
    for (int64_t r = 0; r < a.rows; ++r) {
      const int64_t v = embedding_row(ids[r], a.vocab);
      for (int64_t j = 0; j < a.dim; ++j) out[0][r * a.dim + j] = v < 0 ? NAN : in[1][v * a.dim + j];
    }
    return;
  }
  std::vector<double> acc(static_cast<size_t>(a.vocab * a.dim), 0.0);
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t v = embedding_row(ids[r], a.vocab);
    if (v < 0) continue;
    for (int64_t j = 0; j < a.dim; ++j) acc[static_cast<size_t>(v * a.dim + j)] += in[1][r * a.dim + j];
  }
  for (size_t i = 0; i < acc.size(); ++i) out[0][i] = static_cast<float>(acc[i]);
}

}  // namespace kiln::ref

namespace kiln {

void reference_op(OpKind kind, const OpAttrs& attrs, std::span<const float* const> in, std::span<float* const> out) {
  const OpDesc& d = op_desc(kind);
  const OpArity ar = d.arity(attrs);  // also checks the attrs type
  if (in.size() != ar.in.size() || out.size() != ar.out.size())
    throw Error("reference_op(" + d.name + "): expected " + std::to_string(ar.in.size()) + " inputs and " +
                std::to_string(ar.out.size()) + " outputs, found " + std::to_string(in.size()) + " and " +
                std::to_string(out.size()));
  d.reference(attrs, in, out);
}

}  // namespace kiln
