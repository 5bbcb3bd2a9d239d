// The op table: looking up each op's descriptor (the built-in ones are registered by their families' files,
// core/ops/<family>.cpp), the registry of plugins' ops, cache keys, the checks of a call against its op's
// descriptor, op_name, op_arity and reference_op. Semantics: ops.hpp.
#include "kiln/op_table.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <type_traits>

#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "op_attr_names.hpp"

namespace kiln {

using op_impl::kAttrNames;

namespace {

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
        } else if constexpr (std::is_same_v<A, CastAttrs>) {
          put(k, a.count), put(k, a.from), put(k, a.to);
        } else {
          static_assert(std::is_same_v<A, CustomAttrs>, "every OpAttrs alternative has a key");
          put(k, a.ints.size()), put(k, a.floats.size());
          for (int64_t v : a.ints) put(k, v);
          for (float v : a.floats) put(k, v);
        }
      },
      attrs);
}

// The built-in kinds' descriptors, filled when libkiln_core loads (each core/ops file registers its family's).
struct BuiltinOps {
  std::vector<OpDesc> ops = std::vector<OpDesc>(kBuiltinOpCount);
};
BuiltinOps& builtin_slots() {
  static BuiltinOps b;
  return b;
}
const std::vector<OpDesc>& builtins() { return builtin_slots().ops; }

void check_desc(const OpDesc& d) {
  if (d.name.empty()) throw Error("register_op: the op has no name");
  for (char ch : d.name)
    if (!(std::islower(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) || ch == '_'))
      throw Error("register_op: op name '" + d.name + "' must use lower-case letters, digits and '_' only");
  if (!d.arity) throw Error("register_op: op '" + d.name + "' has no arity (buffer sizes) function");
  if (!d.reference) throw Error("register_op: op '" + d.name + "' has no reference implementation");
  if (d.attrs_index >= std::variant_size_v<OpAttrs>)
    throw Error("register_op: op '" + d.name + "' names attributes alternative " + std::to_string(d.attrs_index) +
                " of " + std::to_string(std::variant_size_v<OpAttrs>));
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
  if (i < kBuiltinOpCount) {
    const OpDesc& d = builtins()[i];
    if (d.name.empty())
      throw Error("internal: built-in op kind " + std::to_string(i) +
                  " has no descriptor (no core/ops file registered it)");
    return d;
  }
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

void register_op(OpKind builtin_kind, OpDesc d) {
  const size_t i = static_cast<size_t>(builtin_kind);
  if (i >= kBuiltinOpCount) throw Error("register_op: kind " + std::to_string(i) + " is not a built-in kind");
  check_desc(d);
  if (!d.key) d.key = builtin_key;
  OpDesc& slot = builtin_slots().ops[i];
  if (!slot.name.empty())
    throw Error("register_op: built-in kind " + std::to_string(i) + " registered twice ('" + slot.name + "', '" +
                d.name + "')");
  slot = std::move(d);
}

void check_builtin_ops() {
  std::string missing;
  for (size_t i = 0; i < kBuiltinOpCount; ++i)
    if (builtins()[i].name.empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  if (!missing.empty())
    throw Error("internal: built-in op kinds without a descriptor (no core/ops file registered them): " + missing);
}

OpKind register_op(OpDesc d) {
  check_desc(d);
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
      fail(std::string(kind) + " " + std::to_string(i) + " has an impossible size of " + std::to_string(elems) +
           " floats");
    const size_t need = static_cast<size_t>(elems) * dtype_size(v.dtype);
    if (!v.block) fail(std::string(kind) + " " + std::to_string(i) + " is not bound to memory");
    if (v.bytes < need || v.offset > v.block->bytes || v.bytes > v.block->bytes - v.offset)
      fail(std::string(kind) + " " + std::to_string(i) + " holds " + std::to_string(v.bytes) + " bytes at offset " +
           std::to_string(v.offset) + " of a " + std::to_string(v.block->bytes) + "-byte block, expected " +
           std::to_string(need) + " bytes (" + std::to_string(elems) + " " + dtype_name(v.dtype) + " values)");
    if (v.offset % sizeof(float) != 0)
      fail(std::string(kind) + " " + std::to_string(i) + " starts at offset " + std::to_string(v.offset) +
           ", not a multiple of 4");
  };
  for (size_t i = 0; i < ar.in.size(); ++i) bound(c.in[i], ar.in[i], "input", i);
  // What is never 16-bit: data inputs (class indices, token ids: bf16 holds integers exactly only up to 256), a
  // loss's value, saved statistics and the outputs the op keeps in float32; a cast's buffers are its attributes'.
  auto want = [&](const BufferView& v, DType t, const char* kind, size_t i) {
    if (v.dtype != t)
      fail(std::string(kind) + " " + std::to_string(i) + " is " + dtype_name(v.dtype) + ", expected " + dtype_name(t));
  };
  for (int i : d.data_inputs)
    if (static_cast<size_t>(i) < c.in.size()) want(c.in[static_cast<size_t>(i)], DType::f32, "input", i);
  for (const auto& outs : {d.saved_outputs, d.f32_outputs})
    for (int o : outs)
      if (static_cast<size_t>(o) < c.out.size()) want(c.out[static_cast<size_t>(o)], DType::f32, "output", o);
  if (d.is_loss && !c.out.empty()) want(c.out[0], DType::f32, "output", 0);
  if (const auto* ca = std::get_if<CastAttrs>(&c.attrs)) {
    want(c.in[0], ca->from, "input", 0);
    want(c.out[0], ca->to, "output", 0);
  }
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
                              iv.bytes == ov.bytes && iv.dtype == ov.dtype);
      if (!allowed) fail("output " + std::to_string(o) + " overlaps input " + std::to_string(i));
    }
    for (size_t p = o + 1; p < c.out.size(); ++p)
      if (static_cast<int>(p) != unused && c.out[p].block && c.out[p].bytes && ov.overlaps(c.out[p]))
        fail("outputs " + std::to_string(o) + " and " + std::to_string(p) + " overlap");
  }
}

// Declared in ops.hpp: an op's name and buffer sizes come from its descriptor.
std::string_view op_name(OpKind k) {
  if (!op_known(k)) return "unknown_op";
  return op_desc(k).name;
}

OpArity op_arity(OpKind k, const OpAttrs& a) { return op_desc(k).arity(a); }

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
