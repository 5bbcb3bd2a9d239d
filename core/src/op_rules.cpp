// The built-in ops' buffer sizes (arity: each one's attributes checked) and gradient rules. Semantics: ops.hpp.
#include <cmath>

#include "op_table_impl.hpp"

namespace kiln::op_impl {

namespace {

void check_strides(std::string_view op, int64_t sh, int64_t sw) {
  if (sh < 1 || sw < 1)
    throw Error(op_label(op) + ": strides must be >= 1, found " + std::to_string(sh) + "x" + std::to_string(sw));
}

}  // namespace

// ---- buffer sizes -------------------------------------------------------------------------------------------

OpArity gemm_arity(OpKind kind, const OpAttrs& attrs) {
  const std::string_view op = kind == OpKind::Gemm ? "gemm" : "batched_gemm";
  const auto& a = attrs_as<GemmAttrs>(op, attrs);
  check_dims(op, {{"m", a.m}, {"n", a.n}, {"k", a.k}, {"batch", a.batch}});
  if (kind == OpKind::Gemm && a.batch != 1)
    throw Error(op_label(op) + ": batch must be 1, found " + std::to_string(a.batch) + " (batched products are batched_gemm)");
  return {{product(op, {a.batch, a.m, a.k}), product(op, {a.batch, a.k, a.n})}, {product(op, {a.batch, a.m, a.n})}};
}

// y's axis i is x's axis perm[i]; the arity checks that perm is a permutation of [0, rank).
OpArity permute_arity(const OpAttrs& attrs) {
  const auto& a = attrs_as<PermuteAttrs>("permute", attrs);
  if (a.rank < 1 || a.rank > kPermuteMaxRank)
    throw Error(op_label("permute") + ": rank must be in [1, " + std::to_string(kPermuteMaxRank) + "], found " +
                std::to_string(a.rank));
  int64_t n = 1;
  bool seen[kPermuteMaxRank] = {};
  for (int64_t i = 0; i < a.rank; ++i) {
    const std::string key = "dims[" + std::to_string(i) + "]";
    check_dims("permute", {{key.c_str(), a.dims[i]}});
    n = product("permute", {n, a.dims[i]});
    const int64_t p = a.perm[i];
    if (p < 0 || p >= a.rank || seen[p])
      throw Error(op_label("permute") + ": perm must be a permutation of 0.." + std::to_string(a.rank - 1) +
                  ", perm[" + std::to_string(i) + "] is " + std::to_string(p));
    seen[p] = true;
  }
  return {{n}, {n}};
}

OpArity bias_arity(OpKind k, const OpAttrs& attrs) {
  const std::string_view op = k == OpKind::BiasAdd ? "bias_add" : "bias_grad";
  const auto& a = attrs_as<BiasAttrs>(op, attrs);
  check_dims(op, {{"outer", a.outer}, {"channels", a.channels}, {"inner", a.inner}});
  const int64_t all = product(op, {a.outer, a.channels, a.inner});
  if (k == OpKind::BiasAdd) return {{all, a.channels}, {all}};
  return {{all}, {a.channels}};
}

OpArity conv_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<ConvAttrs>(op, attrs);
  check_dims(op, {{"n", a.n},
                  {"c", a.c},
                  {"h", a.h},
                  {"w", a.w},
                  {"k", a.k},
                  {"r", a.r},
                  {"s", a.s},
                  {"pad_h", a.pad_h},
                  {"pad_w", a.pad_w},
                  {"oh", a.oh},
                  {"ow", a.ow}});
  check_strides(op, a.stride_h, a.stride_w);
  const int64_t x = product(op, {a.n, a.c, a.h, a.w}), w = product(op, {a.k, a.c, a.r, a.s}),
                y = product(op, {a.n, a.k, a.oh, a.ow});
  if (k == OpKind::Conv2dForward) return {{x, w}, {y}};
  if (k == OpKind::Conv2dBackwardData) return {{y, w}, {x}};
  return {{x, y}, {w}};
}

OpArity pool_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<PoolAttrs>(op, attrs);
  check_dims(op, {{"n", a.n},
                  {"c", a.c},
                  {"h", a.h},
                  {"w", a.w},
                  {"kh", a.kh},
                  {"kw", a.kw},
                  {"pad_h", a.pad_h},
                  {"pad_w", a.pad_w},
                  {"oh", a.oh},
                  {"ow", a.ow}});
  check_strides(op, a.stride_h, a.stride_w);
  const int64_t x = product(op, {a.n, a.c, a.h, a.w}), y = product(op, {a.n, a.c, a.oh, a.ow});
  if (k == OpKind::MaxPoolForward || k == OpKind::AvgPoolForward) return {{x}, {y}};
  if (k == OpKind::MaxPoolBackward) return {{x, y, y}, {x}};
  return {{y}, {x}};
}

// ---- gradient rules (backward ops are ordinary ops) ----------------------------------------------------------

void gemm_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<GemmAttrs>(n.attrs);
  if (a.beta != 0.f) throw Error("layer '" + n.layer + "': gemm with beta != 0 has no gradient rule");
  // Gemm and BatchedGemm alike: the same products on each of the `batch` matrices.
  const TensorId A = n.in[0], B = n.in[1], dy = g.dy();
  const OpKind k = n.kind;
  const int64_t b = a.batch;
  if (g.needs_grad(A)) {
    if (!a.trans_a) g.emit_grad(A, k, GemmAttrs{a.m, a.k, a.n, false, !a.trans_b, a.alpha, 0.f, b}, {dy, B});
    else g.emit_grad(A, k, GemmAttrs{a.k, a.m, a.n, a.trans_b, true, a.alpha, 0.f, b}, {B, dy});
  }
  if (g.needs_grad(B)) {
    if (!a.trans_b) g.emit_grad(B, k, GemmAttrs{a.k, a.n, a.m, !a.trans_a, false, a.alpha, 0.f, b}, {A, dy});
    else g.emit_grad(B, k, GemmAttrs{a.n, a.k, a.m, true, a.trans_a, a.alpha, 0.f, b}, {dy, A});
  }
}

// The inverse permutation, applied to y's shape.
void permute_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  const auto& a = std::get<PermuteAttrs>(n.attrs);
  PermuteAttrs inv;
  inv.rank = a.rank;
  for (int64_t i = 0; i < a.rank; ++i) {
    inv.dims[i] = a.dims[a.perm[i]];
    inv.perm[a.perm[i]] = i;
  }
  g.emit_grad(n.in[0], OpKind::Permute, inv, {g.dy()});
}

void bias_add_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.contribute(n.in[0], g.dy());
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::BiasGrad, n.attrs, {g.dy()});
}

void conv_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::Conv2dBackwardData, n.attrs, {g.dy(), n.in[1]});
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::Conv2dBackwardFilter, n.attrs, {n.in[0], g.dy()});
}

void max_pool_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::MaxPoolBackward, n.attrs, {n.in[0], n.out[0], g.dy()});
}

void avg_pool_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::AvgPoolBackward, n.attrs, {g.dy()});
}

// relu, sigmoid and tanh backward read the forward output y; gelu, gelu_tanh and silu the input x.
void activation_grad(GradContext& g) {
  const Node& n = g.node();
  const bool from_x = activation_backward_reads_input(std::get<ActivationAttrs>(n.attrs).act);
  if (g.needs_grad(n.in[0]))
    g.emit_grad(n.in[0], OpKind::ActivationBackward, n.attrs, {from_x ? n.in[0] : n.out[0], g.dy()});
}

void dropout_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::DropoutBackward, n.attrs, {g.dy()});
}

void add_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<ElementwiseAttrs>(n.attrs);
  const float coef[2] = {a.alpha, a.beta};
  for (int i = 0; i < 2; ++i) {
    if (!g.needs_grad(n.in[i])) continue;
    if (coef[i] == 1.f) g.contribute(n.in[i], g.dy());
    else g.emit_grad(n.in[i], OpKind::Scale, ElementwiseAttrs{a.count, coef[i], 0.f}, {g.dy()});
  }
}

void mul_grad(GradContext& g) {
  const Node& n = g.node();
  for (int i = 0; i < 2; ++i)
    if (g.needs_grad(n.in[i])) g.emit_grad(n.in[i], OpKind::Mul, n.attrs, {g.dy(), n.in[1 - i]});
}

void scale_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  const auto& a = std::get<ElementwiseAttrs>(n.attrs);
  if (a.alpha == 1.f) g.contribute(n.in[0], g.dy());
  else g.emit_grad(n.in[0], OpKind::Scale, a, {g.dy()});
}

void copy_grad(GradContext& g) {
  if (g.needs_grad(g.node().in[0])) g.contribute(g.node().in[0], g.dy());
}

void concat_grad(GradContext& g) {
  const Node& n = g.node();
  std::vector<TensorId> parts;
  for (auto x : n.in) parts.push_back(g.new_tensor(g.shape(x)));
  g.emit(OpKind::Split, n.attrs, {g.dy()}, parts);
  for (size_t i = 0; i < n.in.size(); ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

void split_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  std::vector<TensorId> parts;
  for (size_t i = 0; i < n.out.size(); ++i) {
    TensorId d = g.dy(i);
    if (d == kNoTensor) {  // an unused part contributes zeros
      d = g.new_tensor(g.shape(n.out[i]));
      g.emit(OpKind::Fill, ElementwiseAttrs{g.shape(n.out[i]).numel(), 0.f, 0.f}, {}, {d});
    }
    parts.push_back(d);
  }
  g.emit_grad(n.in[0], OpKind::Concat, n.attrs, parts);
}

void embedding_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::EmbeddingBackward, n.attrs, {n.in[0], g.dy()});
}

OpArity embedding_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<EmbeddingAttrs>(op, attrs);
  check_dims(op, {{"rows", a.rows}, {"vocab", a.vocab}, {"dim", a.dim}});
  const int64_t table = product(op, {a.vocab, a.dim}), rows = product(op, {a.rows, a.dim});
  if (k == OpKind::EmbeddingForward) return {{a.rows, table}, {rows}};
  return {{a.rows, rows}, {table}};
}

void layer_norm_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<LayerNormAttrs>(n.attrs);
  std::vector<TensorId> parts;
  const size_t params = a.bias ? 3 : 2;
  for (size_t i = 0; i < params; ++i) parts.push_back(g.new_tensor(g.shape(n.in[i])));
  g.emit(OpKind::LayerNormBackward, n.attrs, {n.in[0], n.in[1], n.out[1], n.out[2], g.dy()}, parts);
  for (size_t i = 0; i < params; ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

OpArity layer_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<LayerNormAttrs>(op, attrs);
  check_dims(op, {{"rows", a.rows}, {"cols", a.cols}});
  if (!(a.eps > 0.f) || !std::isfinite(a.eps))
    throw Error(op_label(op) + ": eps must be positive and finite, found " + std::to_string(a.eps));
  const int64_t n = product(op, {a.rows, a.cols});
  if (k == OpKind::LayerNormForward) {
    OpArity r{{n, a.cols}, {n, a.rows, a.rows}};
    if (a.bias) r.in.push_back(a.cols);
    return r;
  }
  OpArity r{{n, a.cols, a.rows, a.rows, n}, {n, a.cols}};
  if (a.bias) r.out.push_back(a.cols);
  return r;
}

// Batch norm's mean, rstd and running statistics are saved outputs: only y carries a gradient.
void batch_norm_grad(GradContext& g) {
  const Node& n = g.node();
  std::vector<TensorId> parts;
  for (size_t i = 0; i < 3; ++i) parts.push_back(g.new_tensor(g.shape(n.in[i])));
  g.emit(OpKind::BatchNormBackward, n.attrs, {n.in[0], n.in[1], n.out[1], n.out[2], g.dy()}, parts);
  for (size_t i = 0; i < 3; ++i)
    if (g.needs_grad(n.in[i])) g.contribute(n.in[i], parts[i]);
}

OpArity batch_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<BatchNormAttrs>(op, attrs);
  check_dims(op, {{"n", a.n}, {"c", a.c}, {"inner", a.inner}});
  if (!(a.eps > 0.f) || !std::isfinite(a.eps))
    throw Error(op_label(op) + ": eps must be positive and finite, found " + std::to_string(a.eps));
  if (!(a.momentum >= 0.f && a.momentum <= 1.f))
    throw Error(op_label(op) + ": momentum must be in [0, 1], found " + std::to_string(a.momentum));
  const int64_t x = product(op, {a.n, a.c, a.inner});
  if (a.training && a.c > 0 && product(op, {a.n, a.inner}) < 2)
    throw Error(op_label(op) + ": training needs more than 1 value per channel (n * inner = " +
                std::to_string(a.n * a.inner) + "), as PyTorch's BatchNorm does");
  if (k == OpKind::BatchNormForward) return {{x, a.c, a.c}, {x, a.c, a.c, a.c, a.c}};
  return {{x, a.c, a.c, a.c, x}, {x, a.c, a.c}};
}

// A fused loss already computed its gradient w.r.t. the prediction (out[1]).
void loss_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.contribute(n.in[0], n.out[1]);
}

}  // namespace kiln::op_impl
