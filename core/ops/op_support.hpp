// What the op families' files (core/ops/<family>.cpp) share, internal to libkiln_core: attribute checks for the
// arity functions, the adapters that make a family's reference function and descriptor, and the building blocks
// of the conformance cases. Each family file registers its ops with KILN_CORE_OPS (kiln/op_table.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../src/sdk/op_attr_names.hpp"
#include "kiln/error.hpp"
#include "kiln/op_case.hpp"
#include "kiln/op_table.hpp"

namespace kiln::op_impl {

// ---- attributes ---------------------------------------------------------------------------------------------

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
    if (__builtin_mul_overflow(r, v, &r)) throw Error(op_label(op) + ": buffer size overflows 64 bits");
  return r;
}

// The element count of an op whose attributes are one `count` (elementwise ops, activations, optimizers).
template <class A>
int64_t counted(std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<A>(op, attrs);
  check_dims(op, {{"count", a.count}});
  return a.count;
}

inline void check_strides(std::string_view op, int64_t sh, int64_t sw) {
  if (sh < 1 || sw < 1)
    throw Error(op_label(op) + ": strides must be >= 1, found " + std::to_string(sh) + "x" + std::to_string(sw));
}

// ---- references and descriptors -----------------------------------------------------------------------------

// A family's reference function sees its attributes and the buffers as arity() sizes them.
using In = const float* const*;
using Out = float* const*;
using RefFn = std::function<void(const OpAttrs&, std::span<const float* const>, std::span<float* const>)>;

template <class A, void (*F)(const A&, In, Out)>
RefFn ref_of() {
  return [](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(std::get<A>(a), in.data(), out.data());
  };
}
// For a reference shared by the ops of a family, told which one runs.
template <class A, void (*F)(OpKind, const A&, In, Out)>
RefFn ref_of(OpKind k) {
  return [k](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(k, std::get<A>(a), in.data(), out.data());
  };
}

// The fields every descriptor has; register_op gives it the built-in cache key.
template <class A>
OpDesc desc(const char* name, std::function<OpArity(const OpAttrs&)> arity, RefFn reference) {
  OpDesc d;
  d.name = name;
  d.attrs_index = attrs_index_of<A>;
  d.arity = std::move(arity);
  d.reference = std::move(reference);
  return d;
}

// ---- conformance cases --------------------------------------------------------------------------------------

// Integer inputs make most cases exact (as oneDNN's benchdnn does); float cases check precision against the
// tolerances.
using V = std::vector<Gen>;
inline const Gen kI = ints(-3, 3);  // exact products and sums for every size in the tables
inline const Gen kF = uni(-1.f, 1.f);

inline std::string str(int64_t v) { return std::to_string(v); }

// Long loops: llvmpipe (lavapipe) ends a shader invocation's loops after 65535 iterations in all, so a kernel that
// walks a long reduction in one invocation gives a wrong answer past some size (a dense layer of 32000 inputs did).
// Every reduction-like op has cases at and beyond those sizes; any backend must pass them or refuse them through
// supports().

// A family's cases, in the order each op's cases run.
class Table {
 public:
  std::vector<OpCase> cases;
  OpCase& add(std::string variant, OpKind k, OpAttrs a, V in, V out, Check check, bool exact) {
    OpCase c;
    c.id = std::string(op_name(k)) + "/" + variant;
    c.kind = k;
    c.attrs = std::move(a);
    c.in = std::move(in);
    c.out = std::move(out);
    c.check = check;
    c.exact = exact;
    cases.push_back(std::move(c));
    return cases.back();
  }
  // A small float case on which the op's gradient rule is also checked by finite differences (op_gradcheck.cpp);
  // it runs on every backend like any case.
  OpCase& grad(std::string variant, OpKind k, OpAttrs a, V in, V out, Check check) {
    OpCase& c = add("grad." + std::move(variant), k, std::move(a), std::move(in), std::move(out), check, false);
    c.gradcheck = true;
    return c;
  }
};

// OpDesc::cases of op `k`: the cases of its family's table that are k's.
inline std::function<std::vector<OpCase>()> cases_of(OpKind k, void (*family)(Table&)) {
  return [k, family] {
    Table t;
    family(t);
    std::vector<OpCase> mine;
    for (OpCase& c : t.cases)
      if (c.kind == k) mine.push_back(std::move(c));
    return mine;
  };
}

}  // namespace kiln::op_impl
