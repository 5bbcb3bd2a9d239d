// What the op table's files share (op_table.cpp: the registry and cache keys; op_rules.cpp: the built-in ops' buffer
// sizes and gradient rules; op_builtins.cpp: the built-in table): attribute checks and the rules the table names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln::op_impl {

inline constexpr const char* kAttrNames[] = {"GemmAttrs",       "BiasAttrs",    "ConvAttrs",    "PoolAttrs",
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

inline std::string op_label(std::string_view name) { return "op " + std::string(name); }

template <class T>
const T& attrs_as(std::string_view op, const OpAttrs& a) {
  if (const T* p = std::get_if<T>(&a)) return *p;
  throw Error(op_label(op) + ": expected attributes " + kAttrNames[attrs_index_of<T>] + ", found " +
              kAttrNames[a.index()]);
}

// Every size an op is given must be >= 0; a negative one is a bug in whoever built the attrs.
inline void check_dims(std::string_view op, std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (const auto& [name, v] : dims)
    if (v < 0) throw Error(op_label(op) + ": attribute " + name + " must be >= 0, found " + std::to_string(v));
}

// a * b * ... with overflow refused: sizes near 2^63 must not wrap into small buffers.
inline int64_t product(std::string_view op, std::initializer_list<int64_t> f) {
  int64_t r = 1;
  for (int64_t v : f)
    if (__builtin_mul_overflow(r, v, &r))
      throw Error(op_label(op) + ": buffer size overflows 64 bits");
  return r;
}

// ---- buffer sizes (op_rules.cpp) ----------------------------------------------------------------------------

OpArity gemm_arity(OpKind kind, const OpAttrs& attrs);
OpArity permute_arity(const OpAttrs& attrs);
OpArity bias_arity(OpKind k, const OpAttrs& attrs);
OpArity conv_arity(OpKind k, std::string_view op, const OpAttrs& attrs);
OpArity pool_arity(OpKind k, std::string_view op, const OpAttrs& attrs);
OpArity embedding_arity(OpKind k, std::string_view op, const OpAttrs& attrs);
OpArity layer_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs);
OpArity batch_norm_arity(OpKind k, std::string_view op, const OpAttrs& attrs);

// ---- gradient rules (op_rules.cpp) --------------------------------------------------------------------------

void gemm_grad(GradContext& g);
void permute_grad(GradContext& g);
void bias_add_grad(GradContext& g);
void conv_grad(GradContext& g);
void max_pool_grad(GradContext& g);
void avg_pool_grad(GradContext& g);
void activation_grad(GradContext& g);
void dropout_grad(GradContext& g);
void add_grad(GradContext& g);
void mul_grad(GradContext& g);
void scale_grad(GradContext& g);
void copy_grad(GradContext& g);
void concat_grad(GradContext& g);
void split_grad(GradContext& g);
void embedding_grad(GradContext& g);
void layer_norm_grad(GradContext& g);
void batch_norm_grad(GradContext& g);
void loss_grad(GradContext& g);

// Softmax backward reads the forward output y.
template <OpKind Backward>
void from_output_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], Backward, n.attrs, {n.out[0], g.dy()});
}

// ---- cache key (op_table.cpp) and the built-in table (op_builtins.cpp) --------------------------------------

// Everything but the scalars the executor patches each step (learning rate, Adam's t, dropout counters).
void builtin_key(const OpAttrs& attrs, std::string& k);

// One complete descriptor per built-in OpKind, indexed by kind.
std::vector<OpDesc> build_builtins();

}  // namespace kiln::op_impl
