// The conformance case table: the cases every op brings in its descriptor (OpDesc::cases), built-in ops and
// plugins' alike, so an op's cases live with the op (a built-in family's in core/ops/<family>.cpp); then the
// 16-bit variants of those cases, made here for every op alike, and the long 16-bit reductions.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "conformance_impl.hpp"
#include "kiln/half.hpp"
#include "kiln/op_table.hpp"

namespace kiln::conformance {
namespace {

// Buffers a 16-bit layer holds in float32 besides what the op table says (data inputs, saved and f32 outputs, a
// loss's value): its parameters and their gradients, and the saved statistics a backward op reads back. The graph
// gives them float32 (GraphBuilder: a parameter is float32 and only OpDesc::low_precision inputs are cast; a
// parameter's gradient takes its type), so the 16-bit variants keep them float32 too.
struct Float32Slots {
  const char* op;
  std::vector<int> in, out;
};
const Float32Slots kParameterSlots[] = {
    {"bias_add", {1}, {}},                       // b
    {"bias_grad", {}, {0}},                      // db
    {"layer_norm_forward", {1, 2}, {}},          // gamma, beta
    {"layer_norm_backward", {1, 2, 3}, {1, 2}},  // gamma, mean, rstd; dgamma, dbeta
    {"rms_norm_forward", {1}, {}},               // gamma
    {"rms_norm_backward", {1, 2}, {1}},          // gamma, rstd; dgamma
    {"batch_norm_forward", {1, 2}, {}},          // gamma, beta (its statistics are saved outputs)
    {"batch_norm_backward", {1, 2, 3}, {1, 2}},  // gamma, mean, rstd; dgamma, dbeta
    {"embedding_forward", {0, 1}, {}},           // ids, the table
    {"embedding_backward", {0}, {0}},            // ids; dtable
};

// Ops that only ever see parameters, their gradients and optimizer state (float32 under every policy), and the
// cast, whose own cases cover every pair of types: no 16-bit variants.
bool float32_only(const std::string& op) {
  static const char* const kOps[] = {"sgd_update",  "adam_update",         "rmsprop_update", "ema_update",
                                     "sum_squares", "clip_by_global_norm", "loss_unscale",   "cast"};
  for (const char* o : kOps)
    if (op == o) return true;
  return false;
}

bool listed(const std::vector<int>& v, size_t i) {
  return std::find(v.begin(), v.end(), static_cast<int>(i)) != v.end();
}

// An exact case keeps its 16-bit variants exact when its integers are values of bfloat16 (|n| <= 256): the
// float32 result is then exact and rounding it once to the output type has a single right answer.
bool small_integers(const OpCase& c) {
  for (const auto* gens : {&c.in, &c.out})
    for (const Gen& g : *gens) {
      if (g.kind == Gen::sentinel || g.kind == Gen::labels || g.kind == Gen::labels_bad) continue;
      if (g.kind != Gen::ints || g.lo < -256 || g.hi > 256) return false;
    }
  return true;
}

// The value of t next to x (a value of t) towards +inf (up) or -inf: 16-bit types are sign and magnitude.
float step(float x, DType t, bool up) {
  if (x == 0) return half_to_float(up ? 0x0001 : 0x8001, t);
  const uint16_t h = float_to_half(x, t);
  return half_to_float(static_cast<uint16_t>((x > 0) == up ? h + 1 : h - 1), t);
}

// A uniform generator's bounds moved inwards to values of t, so that the rounded data stays inside the range the
// case chose (probabilities in [0.001, 0.999] must not round to 1 in bfloat16 and meet the clamp).
Gen inside(Gen g, DType t) {
  if (g.kind != Gen::uniform || !(g.hi > g.lo)) return g;
  float lo = round_to(g.lo, t), hi = round_to(g.hi, t);
  if (lo < g.lo) lo = step(lo, t, true);
  if (hi > g.hi) hi = step(hi, t, false);
  if (lo < hi) g.lo = lo, g.hi = hi;
  return g;
}

const char* suffix(DType t) { return t == DType::bf16 ? ".bf16" : ".f16"; }

// The case with its inputs and outputs in t, except the float32 ones (see above); empty types when nothing would
// be 16-bit.
OpCase variant(const OpCase& c, const OpDesc& d, DType t) {
  OpCase v = c;
  v.id += suffix(t);
  v.gradcheck = false;
  const Float32Slots* slots = nullptr;
  for (const auto& s : kParameterSlots)
    if (d.name == s.op) slots = &s;
  v.in_dtype.assign(c.in.size(), t);
  v.out_dtype.assign(c.out.size(), t);
  for (size_t i = 0; i < c.in.size(); ++i)
    if (listed(d.data_inputs, i) || c.in[i].kind == Gen::labels || c.in[i].kind == Gen::labels_bad ||
        (slots && listed(slots->in, i)))
      v.in_dtype[i] = DType::f32;
  for (size_t o = 0; o < c.out.size(); ++o)
    if (listed(d.saved_outputs, o) || listed(d.f32_outputs, o) || (d.is_loss && o == 0) ||
        (slots && listed(slots->out, o)))
      v.out_dtype[o] = DType::f32;
  // A loss's gradient takes its prediction's type; an output written in place has its input's.
  if (d.is_loss && v.out_dtype.size() > 1 && !v.in_dtype.empty()) v.out_dtype[1] = v.in_dtype[0];
  for (auto [o, i] : c.alias) v.out_dtype[static_cast<size_t>(o)] = v.in_dtype[static_cast<size_t>(i)];
  for (size_t i = 0; i < v.in.size(); ++i) v.in[i] = inside(v.in[i], v.in_dtype[i]);
  for (size_t o = 0; o < v.out.size(); ++o) v.out[o] = inside(v.out[o], v.out_dtype[o]);
  return v;
}

bool any_16bit(const OpCase& c) {
  for (const auto* types : {&c.in_dtype, &c.out_dtype})
    for (DType t : *types)
      if (t != DType::f32) return true;
  return false;
}

OpCase long_case(std::string id, OpKind k, OpAttrs a, std::vector<Gen> in, std::vector<DType> in_t,
                 std::vector<DType> out_t, Check check) {
  OpCase c;
  c.id = std::move(id);
  c.kind = k;
  c.attrs = std::move(a);
  c.in = std::move(in);
  c.out.assign(out_t.size(), kOut);
  c.check = check;
  c.in_dtype = std::move(in_t);
  c.out_dtype = std::move(out_t);
  return c;
}

// Rows of 70,000 and more in 16-bit storage, of positive values so that the sums only grow: float32 accumulation
// holds them to float32's error, while a kernel that accumulates in bfloat16 stalls once the running sum's half
// ulp exceeds a term (a sum of 70,000 values near 0.5 stops growing near 2^8) and misses by most of the sum.
std::vector<OpCase> long_reductions() {
  std::vector<OpCase> v;
  const Gen pos = uni(0.f, 1.f);
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string s = suffix(t);
    v.push_back(long_case("gemm/long.nn.2x3x70000" + s, OpKind::Gemm, GemmAttrs{2, 3, 70000}, {pos, pos}, {t, t}, {t},
                          Check::reduction));
    v.push_back(long_case("gemm/long.tn.3x2x100003" + s, OpKind::Gemm, GemmAttrs{3, 2, 100003, true, false}, {pos, pos},
                          {t, t}, {t}, Check::reduction));
    v.push_back(long_case("batched_gemm/long.nt.2x2x3x70001" + s, OpKind::BatchedGemm,
                          GemmAttrs{2, 3, 70001, false, true, 1.f, 0.f, 2}, {pos, pos}, {t, t}, {t}, Check::reduction));
    v.push_back(long_case("reduce_sum/long.2x70000x3" + s, OpKind::ReduceSum, ReduceAttrs{2, 70000, 3}, {pos}, {t}, {t},
                          Check::reduction));
    v.push_back(long_case("reduce_sum/long.1x100000x1" + s, OpKind::ReduceSum, ReduceAttrs{1, 100000, 1}, {pos}, {t},
                          {t}, Check::reduction));
    v.push_back(long_case("bias_grad/long.1x2x70000" + s, OpKind::BiasGrad, BiasAttrs{1, 2, 70000}, {pos}, {t},
                          {DType::f32}, Check::reduction));
    v.push_back(long_case("softmax_forward/long.2x70000" + s, OpKind::SoftmaxForward, SoftmaxAttrs{2, 70000},
                          {uni(-2.f, 2.f)}, {t}, {t}, Check::reduction));
    v.push_back(long_case("softmax_backward/long.2x70000" + s, OpKind::SoftmaxBackward, SoftmaxAttrs{2, 70000},
                          {uni(0.f, 2.f / 70000), pos}, {t, t}, {t}, Check::reduction));
    v.push_back(long_case("layer_norm_forward/long.2x70000" + s, OpKind::LayerNormForward,
                          LayerNormAttrs{2, 70000, 1e-5f, true}, {uni(1.f, 2.f), uni(0.5f, 1.5f), uni(-1.f, 1.f)},
                          {t, DType::f32, DType::f32}, {t, DType::f32, DType::f32}, Check::reduction));
  }
  return v;
}

}  // namespace

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
  std::vector<OpCase> longs = long_reductions();
  for (size_t k = 0; k < op_count(); ++k) {
    const OpDesc& d = op_desc(static_cast<OpKind>(k));
    if (!d.cases) continue;
    std::vector<OpCase> halves;
    for (OpCase c : d.cases()) {
      c.kind = static_cast<OpKind>(k);
      if (c.id.rfind(d.name + "/", 0) != 0) c.id = d.name + "/" + c.id;
      // 16-bit variants of every case of the op that is not already typed, not large (the suite's time), and
      // either inexact or exact in small integers.
      if (!float32_only(d.name) && c.in_dtype.empty() && c.out_dtype.empty() && !c.large &&
          (!c.exact || small_integers(c)))
        for (DType t : {DType::bf16, DType::f16}) {
          OpCase h = variant(c, d, t);
          if (any_16bit(h)) halves.push_back(std::move(h));
        }
      all.push_back(std::move(c));
    }
    for (auto& h : halves) all.push_back(std::move(h));
    for (auto& c : longs)
      if (c.kind == static_cast<OpKind>(k) && d.cases) all.push_back(std::move(c));
  }
  return all;
}

}  // namespace kiln::conformance
