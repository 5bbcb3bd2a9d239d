// Axis permutation: y's axis i is x's axis perm[i] (attention's (B, T, H, D) <-> (B, H, T, D) and the fused
// (B, T, 3, H, D) projection). Semantics: ops.hpp.
#include "kiln/onnx_export.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

// The arity checks that perm is a permutation of [0, rank).
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
      throw Error(op_label("permute") + ": perm must be a permutation of 0.." + std::to_string(a.rank - 1) + ", perm[" +
                  std::to_string(i) + "] is " + std::to_string(p));
    seen[p] = true;
  }
  return {{n}, {n}};
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

void permute_ref(const PermuteAttrs& a, In in, Out out) {
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

void permute_cases(Table& t) {
  struct P {
    std::vector<int64_t> dims, perm;
    bool large;
  };
  const P perms[] = {{{7}, {0}, false},
                     {{3, 5}, {1, 0}, false},
                     {{2, 4, 3, 5}, {0, 2, 1, 3}, false},        // (B, T, H, D) -> (B, H, T, D)
                     {{2, 3, 4, 5}, {0, 2, 1, 3}, false},        // and back
                     {{12, 64, 4, 32}, {0, 2, 1, 3}, false},     // nanoGPT's heads
                     {{2, 5, 3, 2, 4}, {2, 0, 3, 1, 4}, false},  // fused (B, T, 3, H, D) -> (3, B, H, T, D)
                     {{3, 2, 2, 5, 4}, {1, 3, 0, 2, 4}, false},  // and back
                     {{2, 3, 1, 4, 2, 3}, {5, 3, 1, 0, 4, 2}, false},
                     {{3, 0, 4}, {2, 1, 0}, false},
                     {{64, 257, 3, 67}, {0, 2, 1, 3}, true},
                     {{1, 1031, 5, 997}, {3, 1, 2, 0}, true}};
  for (const P& p : perms) {
    PermuteAttrs a;
    a.rank = static_cast<int64_t>(p.dims.size());
    std::string v;
    for (size_t i = 0; i < p.dims.size(); ++i) {
      a.dims[i] = p.dims[i], a.perm[i] = p.perm[i];
      if (i) v += 'x';
      v += str(p.dims[i]);
    }
    v += ".perm";
    for (int64_t q : p.perm) v += str(q);
    t.add(v + ".int", OpKind::Permute, a, {kI}, {kOut}, Check::elementwise, true).large = p.large;
  }
  PermuteAttrs p;
  p.rank = 5, p.dims = {2, 3, 3, 2, 2}, p.perm = {2, 0, 3, 1, 4};
  t.grad("2x3x3x2x2.perm20314", OpKind::Permute, p, {kF}, {kOut}, Check::elementwise);
}

// ONNX: the view's dims (batch first), then Transpose; the output keeps Kiln's shape.
void permute_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<PermuteAttrs>(n.attrs);
  std::vector<int64_t> dims(a.dims.begin(), a.dims.begin() + a.rank), perm(a.perm.begin(), a.perm.begin() + a.rank);
  const std::string v = e.reshape(e.in(g, n, 0), dims, e.out(g, n, 0) + "/view");
  e.add(OnnxNode{"Transpose", {v}, {e.out(g, n, 0) + "/t"}, {}}.ints("perm", perm));
  std::vector<int64_t> od(static_cast<size_t>(a.rank));
  for (int64_t i = 0; i < a.rank; ++i)
    od[static_cast<size_t>(i)] = dims[static_cast<size_t>(perm[static_cast<size_t>(i)])];
  const Shape& ys = g.tensor(n.out[0]).shape;
  if (perm[0] == 0) {
    e.reshape(e.out(g, n, 0) + "/t", ys.dims(), e.out(g, n, 0));
  } else if (ys.dims() == od) {  // the batch moved off axis 0: the output is the transposed view as it is
    e.add(OnnxNode{"Identity", {e.out(g, n, 0) + "/t"}, {e.out(g, n, 0)}, {}});
  } else {
    e.refuse(n, "a permute that moves the batch axis and reshapes");
  }
}

}  // namespace

KILN_CORE_OPS(permute) {
  OpDesc d = desc<PermuteAttrs>("permute", permute_arity, ref_of<PermuteAttrs, permute_ref>());
  d.grad = permute_grad;
  d.cases = cases_of(OpKind::Permute, permute_cases);
  register_op(OpKind::Permute, std::move(d));
  register_onnx_mapping(OpKind::Permute, permute_onnx);
}

}  // namespace kiln::op_impl
