// The op table: one descriptor per built-in op (name, attributes, buffer sizes, aliasing, loss role, step
// scalars, gradient rule, reference, cache key) and the registry of plugins' ops. Semantics: ops.hpp.
#include "kiln/op_table.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <type_traits>

#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/strategy.hpp"
#include "reference_impl.hpp"

namespace kiln {

namespace {

constexpr const char* kAttrNames[] = {"GemmAttrs",       "BiasAttrs",    "ConvAttrs",    "PoolAttrs",
                                      "ActivationAttrs", "SoftmaxAttrs", "LossAttrs",    "ElementwiseAttrs",
                                      "ReduceAttrs",     "ConcatAttrs",  "DropoutAttrs", "SgdAttrs",
                                      "AdamAttrs",       "RmspropAttrs", "EmaAttrs",     "EmbeddingAttrs",
                                      "LayerNormAttrs",  "PermuteAttrs", "BatchNormAttrs", "CustomAttrs"};
static_assert(std::size(kAttrNames) == std::variant_size_v<OpAttrs>, "name every OpAttrs alternative");

template <class T, size_t... I>
constexpr size_t index_of(std::index_sequence<I...>) {
  size_t r = 0;
  ((std::is_same_v<T, std::variant_alternative_t<I, OpAttrs>> ? (r = I, 0) : 0), ...);
  return r;
}
template <class T>
constexpr size_t attrs_index_of = index_of<T>(std::make_index_sequence<std::variant_size_v<OpAttrs>>{});

std::string op_label(std::string_view name) { return "op " + std::string(name); }

template <class T>
const T& attrs_as(std::string_view op, const OpAttrs& a) {
  if (const T* p = std::get_if<T>(&a)) return *p;
  throw Error(op_label(op) + ": expected attributes " + kAttrNames[attrs_index_of<T>] + ", found " +
              kAttrNames[a.index()]);
}

// Every size an op is given must be >= 0; a negative one is a bug in whoever built the attrs.
void check_dims(std::string_view op, std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (const auto& [name, v] : dims)
    if (v < 0) throw Error(op_label(op) + ": attribute " + name + " must be >= 0, found " + std::to_string(v));
}

// a * b * ... with overflow refused: sizes near 2^63 must not wrap into small buffers.
int64_t product(std::string_view op, std::initializer_list<int64_t> f) {
  int64_t r = 1;
  for (int64_t v : f)
    if (__builtin_mul_overflow(r, v, &r))
      throw Error(op_label(op) + ": buffer size overflows 64 bits");
  return r;
}

void check_strides(std::string_view op, int64_t sh, int64_t sw) {
  if (sh < 1 || sw < 1)
    throw Error(op_label(op) + ": strides must be >= 1, found " + std::to_string(sh) + "x" + std::to_string(sw));
}

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

template <class A>
int64_t counted(std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<A>(op, attrs);
  check_dims(op, {{"count", a.count}});
  return a.count;
}

void check_activation(std::string_view op, const OpAttrs& attrs) {
  const int act = static_cast<int>(std::get<ActivationAttrs>(attrs).act);
  if (act < 0 || act >= kActivationCount)
    throw Error(op_label(op) + ": unknown activation " + std::to_string(act));
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

// Softmax backward reads the forward output y.
template <OpKind Backward>
void from_output_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], Backward, n.attrs, {n.out[0], g.dy()});
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

// ---- cache keys ---------------------------------------------------------------------------------------------

template <class T>
void put(std::string& k, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  k.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Everything but the scalars the executor patches each step (learning rate, Adam's t, dropout counters).
void builtin_key(const OpAttrs& attrs, std::string& k) {
  put(k, attrs.index());
  std::visit(
      [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<A, GemmAttrs>) {
          put(k, a.m), put(k, a.n), put(k, a.k), put(k, a.trans_a), put(k, a.trans_b), put(k, a.alpha), put(k, a.beta);
          put(k, a.batch);
        } else if constexpr (std::is_same_v<A, BiasAttrs>) {
          put(k, a.outer), put(k, a.channels), put(k, a.inner);
        } else if constexpr (std::is_same_v<A, ConvAttrs>) {
          for (int64_t v : {a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow})
            put(k, v);
        } else if constexpr (std::is_same_v<A, PoolAttrs>) {
          for (int64_t v : {a.n, a.c, a.h, a.w, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow})
            put(k, v);
        } else if constexpr (std::is_same_v<A, ActivationAttrs>) {
          put(k, a.act), put(k, a.count);
        } else if constexpr (std::is_same_v<A, SoftmaxAttrs>) {
          put(k, a.rows), put(k, a.cols), put(k, a.causal);
        } else if constexpr (std::is_same_v<A, LossAttrs>) {
          put(k, a.rows), put(k, a.cols), put(k, a.scale), put(k, a.from_logits), put(k, a.soft_labels);
        } else if constexpr (std::is_same_v<A, ElementwiseAttrs>) {
          put(k, a.count), put(k, a.alpha), put(k, a.beta);
        } else if constexpr (std::is_same_v<A, ReduceAttrs>) {
          put(k, a.outer), put(k, a.reduce), put(k, a.inner);
        } else if constexpr (std::is_same_v<A, ConcatAttrs>) {
          put(k, a.outer), put(k, a.inner), put(k, a.sizes.size());
          for (int64_t s : a.sizes) put(k, s);
        } else if constexpr (std::is_same_v<A, DropoutAttrs>) {
          put(k, a.count), put(k, a.rate), put(k, a.seed);
        } else if constexpr (std::is_same_v<A, SgdAttrs>) {
          put(k, a.count), put(k, a.momentum), put(k, a.weight_decay), put(k, a.nesterov);
        } else if constexpr (std::is_same_v<A, AdamAttrs>) {
          put(k, a.count), put(k, a.beta1), put(k, a.beta2), put(k, a.eps), put(k, a.weight_decay);
          put(k, a.decoupled_decay);
        } else if constexpr (std::is_same_v<A, RmspropAttrs>) {
          put(k, a.count), put(k, a.rho), put(k, a.eps), put(k, a.momentum);
        } else if constexpr (std::is_same_v<A, EmaAttrs>) {
          put(k, a.count), put(k, a.warmup ? a.max_decay : a.decay), put(k, a.warmup);
        } else if constexpr (std::is_same_v<A, EmbeddingAttrs>) {
          put(k, a.rows), put(k, a.vocab), put(k, a.dim);
        } else if constexpr (std::is_same_v<A, LayerNormAttrs>) {
          put(k, a.rows), put(k, a.cols), put(k, a.eps), put(k, a.bias);
        } else if constexpr (std::is_same_v<A, PermuteAttrs>) {
          put(k, a.rank);
          for (int64_t i = 0; i < a.rank && i < kPermuteMaxRank; ++i) put(k, a.dims[i]), put(k, a.perm[i]);
        } else if constexpr (std::is_same_v<A, BatchNormAttrs>) {
          put(k, a.n), put(k, a.c), put(k, a.inner), put(k, a.eps), put(k, a.momentum), put(k, a.training);
        } else {
          static_assert(std::is_same_v<A, CustomAttrs>, "every OpAttrs alternative has a key");
          put(k, a.ints.size()), put(k, a.floats.size());
          for (int64_t v : a.ints) put(k, v);
          for (float v : a.floats) put(k, v);
        }
      },
      attrs);
}

// ---- the built-in table -------------------------------------------------------------------------------------

using RefFn = std::function<void(const OpAttrs&, std::span<const float* const>, std::span<float* const>)>;

template <class A, void (*F)(const A&, ref::In, ref::Out)>
RefFn ref_of() {
  return [](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(std::get<A>(a), in.data(), out.data());
  };
}
template <class A, void (*F)(OpKind, const A&, ref::In, ref::Out)>
RefFn ref_of(OpKind k) {
  return [k](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(k, std::get<A>(a), in.data(), out.data());
  };
}

template <class A>
OpDesc desc(const char* name, std::function<OpArity(const OpAttrs&)> arity, RefFn reference) {
  OpDesc d;
  d.name = name;
  d.attrs_index = attrs_index_of<A>;
  d.arity = std::move(arity);
  d.reference = std::move(reference);
  d.key = builtin_key;
  return d;
}

std::vector<OpDesc> build_builtins() {
  using K = OpKind;
  std::vector<OpDesc> t(kBuiltinOpCount);
  auto set = [&](K k, OpDesc d) { t[static_cast<size_t>(k)] = std::move(d); };

  {
    OpDesc d = desc<GemmAttrs>("gemm", [](const OpAttrs& a) { return gemm_arity(K::Gemm, a); },
                               ref_of<GemmAttrs, ref::gemm>());
    d.grad = gemm_grad;
    set(K::Gemm, std::move(d));
  }
  {
    OpDesc d = desc<GemmAttrs>("batched_gemm", [](const OpAttrs& a) { return gemm_arity(K::BatchedGemm, a); },
                               ref_of<GemmAttrs, ref::batched_gemm>());
    d.grad = gemm_grad;
    set(K::BatchedGemm, std::move(d));
  }
  {
    OpDesc d = desc<PermuteAttrs>("permute", permute_arity, ref_of<PermuteAttrs, ref::permute>());
    d.grad = permute_grad;
    set(K::Permute, std::move(d));
  }
  {
    OpDesc d = desc<BiasAttrs>("bias_add", [](const OpAttrs& a) { return bias_arity(K::BiasAdd, a); },
                               ref_of<BiasAttrs, ref::bias_add>());
    d.may_alias = {{0, 0}};
    d.grad = bias_add_grad;
    set(K::BiasAdd, std::move(d));
  }
  set(K::BiasGrad, desc<BiasAttrs>("bias_grad", [](const OpAttrs& a) { return bias_arity(K::BiasGrad, a); },
                                   ref_of<BiasAttrs, ref::bias_grad>()));
  for (auto [k, name] : {std::pair{K::Conv2dForward, "conv2d_forward"},
                         std::pair{K::Conv2dBackwardData, "conv2d_backward_data"},
                         std::pair{K::Conv2dBackwardFilter, "conv2d_backward_filter"}}) {
    OpDesc d = desc<ConvAttrs>(name, [k = k, name = name](const OpAttrs& a) { return conv_arity(k, name, a); },
                               ref_of<ConvAttrs, ref::conv2d>(k));
    if (k == K::Conv2dForward) d.grad = conv_grad;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::MaxPoolForward, "max_pool_forward"},
                         std::pair{K::MaxPoolBackward, "max_pool_backward"},
                         std::pair{K::AvgPoolForward, "avg_pool_forward"},
                         std::pair{K::AvgPoolBackward, "avg_pool_backward"}}) {
    OpDesc d = desc<PoolAttrs>(name, [k = k, name = name](const OpAttrs& a) { return pool_arity(k, name, a); },
                               ref_of<PoolAttrs, ref::pool>(k));
    if (k == K::MaxPoolForward) d.grad = max_pool_grad;
    if (k == K::AvgPoolForward) d.grad = avg_pool_grad;
    set(k, std::move(d));
  }
  {
    OpDesc d = desc<ActivationAttrs>("activation_forward",
                                     [](const OpAttrs& a) -> OpArity {
                                       const int64_t n = counted<ActivationAttrs>("activation_forward", a);
                                       check_activation("activation_forward", a);
                                       return {{n}, {n}};
                                     },
                                     ref_of<ActivationAttrs, ref::activation>(K::ActivationForward));
    d.may_alias = {{0, 0}};
    d.grad = activation_grad;
    set(K::ActivationForward, std::move(d));
  }
  {
    OpDesc d = desc<ActivationAttrs>("activation_backward",
                                     [](const OpAttrs& a) -> OpArity {
                                       const int64_t n = counted<ActivationAttrs>("activation_backward", a);
                                       check_activation("activation_backward", a);
                                       return {{n, n}, {n}};
                                     },
                                     ref_of<ActivationAttrs, ref::activation>(K::ActivationBackward));
    d.may_alias = {{0, 1}};
    set(K::ActivationBackward, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::SoftmaxForward, "softmax_forward"}, std::pair{K::SoftmaxBackward, "softmax_backward"}}) {
    OpDesc d = desc<SoftmaxAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<SoftmaxAttrs>(name, attrs);
          check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
          const int64_t n = product(name, {a.rows, a.cols});
          if (k == K::SoftmaxForward) return {{n}, {n}};
          return {{n, n}, {n}};
        },
        ref_of<SoftmaxAttrs, ref::softmax>(k));
    if (k == K::SoftmaxForward) d.grad = from_output_grad<K::SoftmaxBackward>;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::SoftmaxCrossEntropy, "softmax_cross_entropy"},
                         std::pair{K::MeanSquaredError, "mean_squared_error"},
                         std::pair{K::BinaryCrossEntropy, "binary_cross_entropy"}}) {
    OpDesc d = desc<LossAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<LossAttrs>(name, attrs);
          check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
          const int64_t n = product(name, {a.rows, a.cols});
          if (k == K::SoftmaxCrossEntropy) return {{n, a.soft_labels ? n : a.rows}, {1, n}};
          return {{n, n}, {1, n}};
        },
        ref_of<LossAttrs, ref::loss>(k));
    d.is_loss = true;
    d.data_inputs = {1};
    d.grad = loss_grad;
    set(k, std::move(d));
  }
  struct Ew {
    K kind;
    const char* name;
    int inputs;
  };
  for (const Ew e : {Ew{K::Add, "add", 2}, Ew{K::Mul, "mul", 2}, Ew{K::Axpby, "axpby", 1}, Ew{K::Scale, "scale", 1},
                     Ew{K::Fill, "fill", 0}, Ew{K::Copy, "copy", 1}}) {
    OpDesc d = desc<ElementwiseAttrs>(
        e.name,
        [e](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<ElementwiseAttrs>(e.name, a);
          return {std::vector<int64_t>(static_cast<size_t>(e.inputs), n), {n}};
        },
        ref_of<ElementwiseAttrs, ref::elementwise>(e.kind));
    set(e.kind, std::move(d));
  }
  t[size_t(K::Add)].may_alias = {{0, 0}, {0, 1}};
  t[size_t(K::Add)].grad = add_grad;
  t[size_t(K::Mul)].may_alias = {{0, 0}, {0, 1}};
  t[size_t(K::Mul)].grad = mul_grad;
  t[size_t(K::Scale)].may_alias = {{0, 0}};
  t[size_t(K::Scale)].grad = scale_grad;
  t[size_t(K::Copy)].grad = copy_grad;
  set(K::ReduceSum, desc<ReduceAttrs>(
                        "reduce_sum",
                        [](const OpAttrs& attrs) -> OpArity {
                          const auto& a = attrs_as<ReduceAttrs>("reduce_sum", attrs);
                          check_dims("reduce_sum", {{"outer", a.outer}, {"reduce", a.reduce}, {"inner", a.inner}});
                          return {{product("reduce_sum", {a.outer, a.reduce, a.inner})},
                                  {product("reduce_sum", {a.outer, a.inner})}};
                        },
                        ref_of<ReduceAttrs, ref::reduce_sum>()));
  for (auto [k, name] : {std::pair{K::Concat, "concat"}, std::pair{K::Split, "split"}}) {
    OpDesc d = desc<ConcatAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<ConcatAttrs>(name, attrs);
          check_dims(name, {{"outer", a.outer}, {"inner", a.inner}});
          std::vector<int64_t> parts;
          int64_t total = 0;
          for (size_t j = 0; j < a.sizes.size(); ++j) {
            const std::string key = "sizes[" + std::to_string(j) + "]";
            check_dims(name, {{key.c_str(), a.sizes[j]}});
            parts.push_back(product(name, {a.outer, a.sizes[j], a.inner}));
            if (__builtin_add_overflow(total, a.sizes[j], &total)) throw Error(op_label(name) + ": sizes overflow");
          }
          const int64_t whole = product(name, {a.outer, total, a.inner});
          if (k == K::Concat) return {parts, {whole}};
          return {{whole}, parts};
        },
        [concat = k == K::Concat](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
          ref::concat_split(concat, std::get<ConcatAttrs>(a), in.data(), out.data());
        });
    d.grad = k == K::Concat ? concat_grad : split_grad;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::DropoutForward, "dropout_forward"}, std::pair{K::DropoutBackward, "dropout_backward"}}) {
    OpDesc d = desc<DropoutAttrs>(
        name,
        [name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<DropoutAttrs>(name, attrs);
          check_dims(name, {{"count", a.count}});
          if (!(a.rate >= 0.f && a.rate <= 1.f))
            throw Error(op_label(name) + ": rate must be in [0, 1], found " + std::to_string(a.rate));
          return {{a.count}, {a.count}};
        },
        ref_of<DropoutAttrs, ref::dropout>());
    d.may_alias = {{0, 0}};
    d.step_scalars = kStepDropoutCounter;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<DropoutAttrs>(a).counter = static_cast<uint32_t>(s.step); };
    if (k == K::DropoutForward) d.grad = dropout_grad;
    set(k, std::move(d));
  }
  {
    OpDesc d = desc<SgdAttrs>("sgd_update",
                              [](const OpAttrs& a) -> OpArity {
                                const int64_t n = counted<SgdAttrs>("sgd_update", a);
                                return {{n}, {n, n}};
                              },
                              ref_of<SgdAttrs, ref::sgd>());
    d.unused_output = [](const OpAttrs& a) { return std::get<SgdAttrs>(a).momentum == 0.f ? 1 : -1; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<SgdAttrs>(a).lr = s.lr; };
    set(K::SgdUpdate, std::move(d));
  }
  {
    OpDesc d = desc<AdamAttrs>("adam_update",
                               [](const OpAttrs& attrs) -> OpArity {
                                 const int64_t n = counted<AdamAttrs>("adam_update", attrs);
                                 const auto& a = std::get<AdamAttrs>(attrs);
                                 if (a.step < 1)
                                   throw Error("op adam_update: step must be >= 1, found " + std::to_string(a.step));
                                 return {{n}, {n, n, n}};
                               },
                               ref_of<AdamAttrs, ref::adam>());
    d.step_scalars = kStepLearningRate | kStepCount;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<AdamAttrs>(attrs);
      a.lr = s.lr;
      a.step = s.step + 1;
    };
    set(K::AdamUpdate, std::move(d));
  }
  {
    OpDesc d = desc<RmspropAttrs>("rmsprop_update",
                                  [](const OpAttrs& a) -> OpArity {
                                    const int64_t n = counted<RmspropAttrs>("rmsprop_update", a);
                                    return {{n}, {n, n, n}};
                                  },
                                  ref_of<RmspropAttrs, ref::rmsprop>());
    d.unused_output = [](const OpAttrs& a) { return std::get<RmspropAttrs>(a).momentum > 0.f ? -1 : 2; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<RmspropAttrs>(a).lr = s.lr; };
    set(K::RmspropUpdate, std::move(d));
  }
  {
    OpDesc d = desc<EmaAttrs>("ema_update",
                              [](const OpAttrs& a) -> OpArity {
                                const int64_t n = counted<EmaAttrs>("ema_update", a);
                                return {{n}, {n}};
                              },
                              ref_of<EmaAttrs, ref::ema>());
    d.step_scalars = kStepCount;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<EmaAttrs>(attrs);
      if (a.warmup) a.decay = std::min(a.max_decay, static_cast<float>(1 + s.step) / static_cast<float>(10 + s.step));
    };
    set(K::EmaUpdate, std::move(d));
  }

  for (auto [k, name] : {std::pair{K::EmbeddingForward, "embedding_forward"},
                         std::pair{K::EmbeddingBackward, "embedding_backward"}}) {
    OpDesc d = desc<EmbeddingAttrs>(name, [k = k, name = name](const OpAttrs& a) { return embedding_arity(k, name, a); },
                                    ref_of<EmbeddingAttrs, ref::embedding>(k));
    d.data_inputs = {0};
    if (k == K::EmbeddingForward) d.grad = embedding_grad;
    set(k, std::move(d));
  }

  for (auto [k, name] : {std::pair{K::LayerNormForward, "layer_norm_forward"},
                         std::pair{K::LayerNormBackward, "layer_norm_backward"}}) {
    OpDesc d = desc<LayerNormAttrs>(name,
                                    [k = k, name = name](const OpAttrs& a) { return layer_norm_arity(k, name, a); },
                                    ref_of<LayerNormAttrs, ref::layer_norm>(k));
    if (k == K::LayerNormForward) {
      d.grad = layer_norm_grad;
      d.saved_outputs = {1, 2};
    }
    set(k, std::move(d));
  }
  // Gradient clipping by global norm: a sum of squares accumulated over every gradient, then one scale each.
  set(K::SumSquares, desc<ElementwiseAttrs>("sum_squares",
                                            [](const OpAttrs& a) -> OpArity {
                                              const int64_t n = counted<ElementwiseAttrs>("sum_squares", a);
                                              return {{n}, {1}};
                                            },
                                            ref_of<ElementwiseAttrs, ref::sum_squares>()));
  set(K::ClipByGlobalNorm, desc<ElementwiseAttrs>("clip_by_global_norm",
                                                  [](const OpAttrs& a) -> OpArity {
                                                    const int64_t n = counted<ElementwiseAttrs>("clip_by_global_norm", a);
                                                    return {{1}, {n}};
                                                  },
                                                  ref_of<ElementwiseAttrs, ref::clip_by_global_norm>()));
  for (auto [k, name] : {std::pair{K::BatchNormForward, "batch_norm_forward"},
                         std::pair{K::BatchNormBackward, "batch_norm_backward"}}) {
    OpDesc d = desc<BatchNormAttrs>(name,
                                    [k = k, name = name](const OpAttrs& a) { return batch_norm_arity(k, name, a); },
                                    ref_of<BatchNormAttrs, ref::batch_norm>(k));
    if (k == K::BatchNormForward) {
      d.grad = batch_norm_grad;
      d.saved_outputs = {1, 2, 3, 4};
    }
    set(k, std::move(d));
  }
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name.empty() || !t[i].arity || !t[i].reference)
      throw Error("internal: built-in op kind " + std::to_string(i) + " has no complete table entry");
  return t;
}

const std::vector<OpDesc>& builtins() {
  static const std::vector<OpDesc> t = build_builtins();
  return t;
}

// Plugins' ops. A deque keeps references stable as ops are added; registration happens while plugins load.
struct CustomOps {
  std::shared_mutex mu;
  std::deque<OpDesc> ops;
};
CustomOps& custom() {
  static CustomOps c;
  return c;
}

}  // namespace

const OpDesc& op_desc(OpKind k) {
  const size_t i = static_cast<size_t>(k);
  if (i < kBuiltinOpCount) return builtins()[i];
  CustomOps& c = custom();
  std::shared_lock lock(c.mu);
  if (i - kBuiltinOpCount < c.ops.size()) return c.ops[i - kBuiltinOpCount];
  throw Error("unknown op kind " + std::to_string(i) + " (" + std::to_string(kBuiltinOpCount) + " built-in ops, " +
              std::to_string(c.ops.size()) + " registered by plugins)");
}

bool op_known(OpKind k) {
  const size_t i = static_cast<size_t>(k);
  if (i < kBuiltinOpCount) return true;
  CustomOps& c = custom();
  std::shared_lock lock(c.mu);
  return i - kBuiltinOpCount < c.ops.size();
}

size_t op_count() {
  CustomOps& c = custom();
  std::shared_lock lock(c.mu);
  return kBuiltinOpCount + c.ops.size();
}

std::optional<OpKind> find_op(std::string_view name) {
  for (size_t i = 0; i < kBuiltinOpCount; ++i)
    if (builtins()[i].name == name) return static_cast<OpKind>(i);
  CustomOps& c = custom();
  std::shared_lock lock(c.mu);
  for (size_t i = 0; i < c.ops.size(); ++i)
    if (c.ops[i].name == name) return static_cast<OpKind>(kBuiltinOpCount + i);
  return std::nullopt;
}

OpKind register_op(OpDesc d) {
  if (d.name.empty()) throw Error("register_op: the op has no name");
  for (char ch : d.name)
    if (!(std::islower(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) || ch == '_'))
      throw Error("register_op: op name '" + d.name + "' must use lower-case letters, digits and '_' only");
  if (!d.arity) throw Error("register_op: op '" + d.name + "' has no arity (buffer sizes) function");
  if (!d.reference) throw Error("register_op: op '" + d.name + "' has no reference implementation");
  if (d.attrs_index >= std::variant_size_v<OpAttrs>)
    throw Error("register_op: op '" + d.name + "' names attributes alternative " + std::to_string(d.attrs_index) +
                " of " + std::to_string(std::variant_size_v<OpAttrs>));
  if (!d.key) d.key = builtin_key;
  for (size_t i = 0; i < kBuiltinOpCount; ++i)
    if (builtins()[i].name == d.name) throw Error("register_op: '" + d.name + "' is a built-in op");
  CustomOps& c = custom();
  std::unique_lock lock(c.mu);
  for (size_t i = 0; i < c.ops.size(); ++i)
    if (c.ops[i].name == d.name) {
      if (c.ops[i].plugin == d.plugin) return static_cast<OpKind>(kBuiltinOpCount + i);
      throw Error("register_op: op '" + d.name + "' of plugin '" + d.plugin + "' is already registered by plugin '" +
                  c.ops[i].plugin + "'");
    }
  if (kBuiltinOpCount + c.ops.size() >= 0xFFFF) throw Error("register_op: too many ops");
  c.ops.push_back(std::move(d));
  return static_cast<OpKind>(kBuiltinOpCount + c.ops.size() - 1);
}

void append_op_key(OpKind k, const OpAttrs& a, std::string& key) {
  put(key, k);
  op_desc(k).key(a, key);
}

void check_call(const OpCall& c, const std::string& where) {
  const OpDesc& d = op_desc(c.kind);
  auto fail = [&](const std::string& what) { throw DeviceError(where + " op " + d.name + ": " + what); };
  if (c.attrs.index() != d.attrs_index)
    fail(std::string("attributes of the wrong type: expected ") + kAttrNames[d.attrs_index] + ", found " +
         kAttrNames[c.attrs.index()]);
  OpArity ar;
  try {
    ar = d.arity(c.attrs);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (c.in.size() != ar.in.size() || c.out.size() != ar.out.size())
    fail("expected " + std::to_string(ar.in.size()) + " inputs and " + std::to_string(ar.out.size()) +
         " outputs, found " + std::to_string(c.in.size()) + " and " + std::to_string(c.out.size()));
  const int unused = d.unused_output ? d.unused_output(c.attrs) : -1;
  auto bound = [&](const BufferView& v, int64_t elems, const char* kind, size_t i) {
    if (elems == 0) return;
    if (elems < 0 || static_cast<uint64_t>(elems) > SIZE_MAX / sizeof(float))
      fail(std::string(kind) + " " + std::to_string(i) + " has an impossible size of " + std::to_string(elems) + " floats");
    const size_t need = static_cast<size_t>(elems) * sizeof(float);
    if (!v.block) fail(std::string(kind) + " " + std::to_string(i) + " is not bound to memory");
    if (v.bytes < need || v.offset > v.block->bytes || v.bytes > v.block->bytes - v.offset)
      fail(std::string(kind) + " " + std::to_string(i) + " holds " + std::to_string(v.bytes) + " bytes at offset " +
           std::to_string(v.offset) + " of a " + std::to_string(v.block->bytes) + "-byte block, expected " +
           std::to_string(need) + " bytes (" + std::to_string(elems) + " floats)");
    if (v.offset % sizeof(float) != 0)
      fail(std::string(kind) + " " + std::to_string(i) + " starts at offset " + std::to_string(v.offset) +
           ", not a multiple of 4");
  };
  for (size_t i = 0; i < ar.in.size(); ++i) bound(c.in[i], ar.in[i], "input", i);
  for (size_t o = 0; o < ar.out.size(); ++o)
    if (static_cast<int>(o) != unused) bound(c.out[o], ar.out[o], "output", o);
  for (size_t o = 0; o < c.out.size(); ++o) {
    const BufferView& ov = c.out[o];
    if (!ov.block || ov.bytes == 0 || static_cast<int>(o) == unused) continue;
    for (size_t i = 0; i < c.in.size(); ++i) {
      const BufferView& iv = c.in[i];
      if (!iv.block || iv.bytes == 0 || !ov.overlaps(iv)) continue;
      bool allowed = false;
      for (auto [ao, ai] : d.may_alias)
        allowed = allowed || (ao == static_cast<int>(o) && ai == static_cast<int>(i) && iv.offset == ov.offset &&
                              iv.bytes == ov.bytes);
      if (!allowed) fail("output " + std::to_string(o) + " overlaps input " + std::to_string(i));
    }
    for (size_t p = o + 1; p < c.out.size(); ++p)
      if (static_cast<int>(p) != unused && c.out[p].block && c.out[p].bytes && ov.overlaps(c.out[p]))
        fail("outputs " + std::to_string(o) + " and " + std::to_string(p) + " overlap");
  }
}

}  // namespace kiln
