// Matrix products: gemm, and batched_gemm (the same product on each of `batch` matrices, attention's scores and
// values). Semantics: ops.hpp.
// Also the dense layer that emits gemm.
#include <cmath>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity gemm_arity(OpKind kind, const OpAttrs& attrs) {
  const std::string_view op = kind == OpKind::Gemm ? "gemm" : "batched_gemm";
  const auto& a = attrs_as<GemmAttrs>(op, attrs);
  check_dims(op, {{"m", a.m}, {"n", a.n}, {"k", a.k}, {"batch", a.batch}});
  if (kind == OpKind::Gemm && a.batch != 1)
    throw Error(op_label(op) + ": batch must be 1, found " + std::to_string(a.batch) +
                " (batched products are batched_gemm)");
  return {{product(op, {a.batch, a.m, a.k}), product(op, {a.batch, a.k, a.n})}, {product(op, {a.batch, a.m, a.n})}};
}

void gemm_grad(GradContext& g) {
  const Node& n = g.node();
  const auto& a = std::get<GemmAttrs>(n.attrs);
  if (a.beta != 0.f) throw Error("layer '" + n.layer + "': gemm with beta != 0 has no gradient rule");
  // Gemm and BatchedGemm alike: the same products on each of the `batch` matrices.
  const TensorId A = n.in[0], B = n.in[1], dy = g.dy();
  const OpKind k = n.kind;
  const int64_t b = a.batch;
  if (g.needs_grad(A)) {
    if (!a.trans_a)
      g.emit_grad(A, k, GemmAttrs{a.m, a.k, a.n, false, !a.trans_b, a.alpha, 0.f, b}, {dy, B});
    else
      g.emit_grad(A, k, GemmAttrs{a.k, a.m, a.n, a.trans_b, true, a.alpha, 0.f, b}, {B, dy});
  }
  if (g.needs_grad(B)) {
    if (!a.trans_b)
      g.emit_grad(B, k, GemmAttrs{a.k, a.n, a.m, !a.trans_a, false, a.alpha, 0.f, b}, {A, dy});
    else
      g.emit_grad(B, k, GemmAttrs{a.n, a.k, a.m, true, a.trans_a, a.alpha, 0.f, b}, {dy, A});
  }
}

// ---- reference ----------------------------------------------------------------------------------------------

void gemm_ref(const GemmAttrs& a, In in, Out out) {
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

void batched_gemm_ref(const GemmAttrs& a, In in, Out out) {
  const int64_t sa = a.m * a.k, sb = a.k * a.n, sy = a.m * a.n;
  for (int64_t b = 0; b < a.batch; ++b) {
    const float* A = in[0] + b * sa;
    const float* B = in[1] + b * sb;
    float* y = out[0] + b * sy;
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
}

// ---- conformance cases --------------------------------------------------------------------------------------

const char* const kTrans[] = {"nn", "nt", "tn", "tt"};

void gemm_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    t.grad(std::string(ta ? "t" : "n") + (tb ? "t" : "n") + ".5x4x3.alpha0.5", OpKind::Gemm,
           GemmAttrs{5, 4, 3, ta, tb, 0.5f, 0.f}, {f, f}, {kOut}, Check::reduction);
  }

  struct S {
    int64_t m, n, k;
  };
  const S shapes[] = {{1, 1, 1},    {1, 7, 3},     {5, 1, 9},     {2, 3, 5},   {17, 33, 65},  {63, 64, 65},
                      {64, 64, 64}, {65, 63, 127}, {129, 17, 31}, {3, 257, 5}, {31, 97, 200}, {100, 1, 1000}};
  for (const S& s : shapes)
    for (int tr = 0; tr < 4; ++tr) {
      GemmAttrs a{s.m, s.n, s.k, (tr & 2) != 0, (tr & 1) != 0, 1.f, 0.f};
      t.add(std::string(kTrans[tr]) + "." + str(s.m) + "x" + str(s.n) + "x" + str(s.k) + ".int", OpKind::Gemm, a,
            {kI, kI}, {kOut}, Check::reduction, true);
    }
  const S fshapes[] = {{17, 33, 65}, {64, 64, 64}, {65, 63, 127}, {129, 17, 31}};
  for (int i = 0; i < 4; ++i) {
    const S& s = fshapes[i];
    GemmAttrs a{s.m, s.n, s.k, (i & 2) != 0, (i & 1) != 0, 1.f, 0.f};
    t.add(std::string(kTrans[i]) + "." + str(s.m) + "x" + str(s.n) + "x" + str(s.k) + ".float", OpKind::Gemm, a,
          {kF, kF}, {kOut}, Check::reduction, false);
  }
  t.add("nn.33x17x9.alpha2.beta-1.int", OpKind::Gemm, GemmAttrs{33, 17, 9, false, false, 2.f, -1.f}, {kI, kI}, {kI},
        Check::reduction, true);
  t.add("tn.70x66x40.alpha0.5.beta0.25.float", OpKind::Gemm, GemmAttrs{70, 66, 40, true, false, 0.5f, 0.25f}, {kF, kF},
        {kF}, Check::reduction, false);
  t.add("nn.2049x33x17.int", OpKind::Gemm, GemmAttrs{2049, 33, 17}, {kI, kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("nn.512x512x512.float", OpKind::Gemm, GemmAttrs{512, 512, 512}, {kF, kF}, {kOut}, Check::reduction, false)
      .large = true;

  // Long loops (op_support.hpp): K = 29952 ran right and 29968 wrong (35 loop iterations per 16-wide K step); 32000
  // is the report's layer; 600001 is past what one invocation may walk even at one iteration per step
  // (16 * 32768 here).
  const int64_t ks[] = {29800, 30000, 32000, 70001};
  for (int64_t k : ks)
    t.add("nn.3x10x" + str(k) + ".int", OpKind::Gemm, GemmAttrs{3, 10, k}, {kI, kI}, {kOut}, Check::reduction, true);
  t.add("nn.8x10x32000.float", OpKind::Gemm, GemmAttrs{8, 10, 32000}, {kF, kF}, {kOut}, Check::reduction, false);
  t.add("tt.65x3x40000.float", OpKind::Gemm, GemmAttrs{65, 3, 40000, true, true}, {kF, kF}, {kOut}, Check::reduction,
        false);
  t.add("tn.2x3x600001.alpha2.beta-1.int", OpKind::Gemm, GemmAttrs{2, 3, 600001, true, false, 2.f, -1.f}, {kI, kI},
        {kI}, Check::reduction, true)
      .large = true;
  t.add("nt.3x2x300007.float", OpKind::Gemm, GemmAttrs{3, 2, 300007, false, true}, {kF, kF}, {kOut}, Check::reduction,
        false)
      .large = true;
}

// Attention's products: nanoGPT's shapes (48 heads x 64 x 64 scores over 32, and back), empty batches and
// matrices; long reductions: K = 70001 in one batch, more batches than one Vulkan dispatch may launch (65535).
void batched_gemm_cases(Table& t) {
  struct G {
    int64_t batch, m, n, k;
    bool large;
  };
  const G shapes[] = {{1, 1, 1, 1, false},     {3, 5, 7, 2, false},     {4, 17, 33, 65, false}, {2, 65, 63, 127, false},
                      {48, 64, 64, 32, false}, {48, 64, 32, 64, false}, {0, 3, 4, 5, false},    {5, 0, 3, 4, false},
                      {2, 3, 4, 0, false},     {70000, 2, 3, 2, true},  {2, 3, 10, 70001, true}};
  for (const G& s : shapes)
    for (int tr = 0; tr < 4; ++tr) {
      const GemmAttrs a{s.m, s.n, s.k, (tr & 2) != 0, (tr & 1) != 0, 1.f, 0.f, s.batch};
      const std::string v =
          std::string(kTrans[tr]) + "." + str(s.batch) + "x" + str(s.m) + "x" + str(s.n) + "x" + str(s.k);
      t.add(v + ".int", OpKind::BatchedGemm, a, {kI, kI}, {kOut}, Check::reduction, true).large = s.large;
      if (!s.large && s.m * s.n * s.k > 0 && s.batch > 1)
        t.add(v + ".float", OpKind::BatchedGemm, a, {kF, kF}, {kOut}, Check::reduction, false);
    }
  // nanoGPT's scaled scores q k^T / sqrt(32); alpha and beta together.
  t.add("nt.48x64x64x32.scaled.float", OpKind::BatchedGemm, GemmAttrs{64, 64, 32, false, true, 0.17677669f, 0.f, 48},
        {kF, kF}, {kOut}, Check::reduction, false);
  t.add("tn.3x33x17x9.alpha2.beta-1.int", OpKind::BatchedGemm, GemmAttrs{33, 17, 9, true, false, 2.f, -1.f, 3},
        {kI, kI}, {kI}, Check::reduction, true);
  for (int tr = 0; tr < 4; ++tr)
    t.grad(std::string(kTrans[tr]) + ".3x5x4x3.alpha0.5", OpKind::BatchedGemm,
           GemmAttrs{5, 4, 3, (tr & 2) != 0, (tr & 1) != 0, 0.5f, 0.f, 3}, {kF, kF}, {kOut}, Check::reduction);
}

// ---- the layer ---------------------------------------------------------------------------------------------

class DenseLayer : public Layer {
 public:
  explicit DenseLayer(const ConfigNode& c)
      : tie_(c.get_string("tie", "")),
        units_(tie_.empty() ? c.get_int("units") : c.get_int("units", 0)),
        use_bias_(c.get_bool("use_bias", true)),
        act_(read_activation(c, "activation", "linear")),
        init_std_(c.get_float("init_std", 0.0)),
        where_(c.where(tie_.empty() ? "units" : "tie")) {
    if (c.has("init_std") && (!(init_std_ > 0) || !std::isfinite(init_std_)))
      c.fail("init_std", "expected a positive, finite standard deviation (leave it out for Glorot-uniform)");
    if (c.has("init_std") && !tie_.empty())
      c.fail("init_std", "has no effect with tie: the kernel is the embedding's table");
    if (!tie_.empty() && tie_.find('.') != std::string::npos)
      c.fail("tie", "expected the name of an embedding layer (its table is shared), found '" + tie_ + "'");
    if (units_ <= 0 && (tie_.empty() || c.has("units")))
      c.fail("units", "expected a positive integer, found " + std::to_string(units_));
    if (!Shape{units_}.fits())
      c.fail("units", "is " + std::to_string(units_) + ", more than one tensor can hold (2^46 float32 values)");
    c.finish();
  }
  std::string type() const override { return "dense"; }
  // x: (N, F) -> y: (N, units); a sequence (N, T, F) -> (N, T, units), the same kernel at every position
  // (PyTorch's nn.Linear on the last dimension).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 2 && s.rank() != 3)
      shape_error(g, "dense expects input (batch, features) or (batch, positions, features), got " + s.str() +
                         "; add a flatten layer before it");
    const int64_t f = s[s.rank() - 1], n = s.numel() / std::max<int64_t>(f, 1);
    Shape out = s;
    out[s.rank() - 1] = units_;
    TensorId y;
    int64_t units = units_;
    if (!tie_.empty()) {
      // Weight tying (nanoGPT's lm_head.weight = wte.weight): y = x table^T with the embedding's (vocab, dim) table.
      const TensorId table = g.shared_param(tie_ + ".table", "tie = \"" + tie_ + "\"");
      const Shape& ts = g.shape(table);
      if (ts.rank() != 2 || ts[1] != f)
        shape_error(g, "tie = \"" + tie_ + "\": the table is " + ts.str() + ", its width must equal this layer's " +
                           std::to_string(f) + " input features");
      if (units_ > 0 && units_ != ts[0])
        shape_error(g, "units = " + std::to_string(units_) + " but the tied table has " + std::to_string(ts[0]) +
                           " rows (leave units out with tie)");
      units = ts[0];
      out[s.rank() - 1] = units;
      check_size(g, out, "output (batch, units)", where_);
      y = g.op1(OpKind::Gemm, GemmAttrs{n, units, f, false, true}, {in[0], table}, out);
    } else {
      check_size(g, {f, units_}, "kernel (features, units)", where_);
      check_size(g, out, "output (batch, units)", where_);
      // Glorot-uniform (Keras), or N(0, init_std^2) (nanoGPT's nn.init.normal_(std=0.02)).
      TensorId w = g.param("kernel", {f, units_},
                           init_std_ > 0 ? Init{InitKind::normal, f, units_, static_cast<float>(init_std_)}
                                         : Init{InitKind::glorot_uniform, f, units_});
      y = g.op1(OpKind::Gemm, GemmAttrs{n, units_, f}, {in[0], w}, out);
    }
    if (use_bias_) {
      TensorId b = g.param("bias", {units}, Init{});
      y = g.op1(OpKind::BiasAdd, BiasAttrs{n, units, 1}, {y, b}, out);
    }
    return act_ ? apply_activation(g, y, *act_) : y;
  }

 private:
  std::string tie_;  // an embedding layer's name: its table is this layer's (transposed) kernel
  int64_t units_;
  bool use_bias_;
  std::optional<std::string> act_;
  double init_std_;    // > 0: N(0, init_std^2) kernel init instead of Glorot-uniform
  std::string where_;  // "run.toml:12: key 'model.layers[1].units'", for size errors at build time
};

// ONNX: Gemm for (N, F) x (F, U) (a bias add may fold into it), else MatMul, which broadcasts over the leading dims
// of (N, T, F) x (F, U).
void gemm_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<GemmAttrs>(n.attrs);
  if (a.trans_a || a.beta != 0.f || a.alpha != 1.f) e.refuse(n, "a transposed or scaled gemm");
  if (g.tensor(n.in[0]).shape.rank() == 2) {
    OnnxNode x{"Gemm", {e.in(g, n, 0), e.in(g, n, 1)}, {e.out(g, n, 0)}, {}};
    if (a.trans_b) x.i("transB", 1);
    e.add(std::move(x));
    e.mark_foldable(n.out[0]);
  } else {
    std::string w = e.in(g, n, 1);
    if (a.trans_b) {
      e.add(OnnxNode{"Transpose", {w}, {w + "/T"}, {}}.ints("perm", {1, 0}));
      w += "/T";
    }
    e.add(OnnxNode{"MatMul", {e.in(g, n, 0), w}, {e.out(g, n, 0)}, {}});
  }
}

// ONNX: MatMul over the leading axes (Kiln's tensors are (batch, ..., rows, cols)).
void batched_gemm_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<GemmAttrs>(n.attrs);
  if (a.beta != 0.f) e.refuse(n, "a batched gemm that accumulates");
  auto operand = [&](size_t i, int64_t rows, int64_t cols, bool trans) {
    const Shape& sh = g.tensor(n.in[i]).shape;
    std::string v = e.in(g, n, i);
    if (sh.rank() < 3 || sh[sh.rank() - 2] != rows || sh[sh.rank() - 1] != cols)
      e.refuse(n, "a batched gemm whose operands are not (..., rows, cols)");
    if (trans) {
      std::vector<int64_t> perm(sh.rank());
      for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      e.add(OnnxNode{"Transpose", {v}, {v + "/T"}, {}}.ints("perm", perm));
      v += "/T";
    }
    return v;
  };
  const std::string A = a.trans_a ? operand(0, a.k, a.m, true) : operand(0, a.m, a.k, false);
  const std::string B = a.trans_b ? operand(1, a.n, a.k, true) : operand(1, a.k, a.n, false);
  if (a.alpha == 1.f) {
    e.add(OnnxNode{"MatMul", {A, B}, {e.out(g, n, 0)}, {}});
  } else {
    e.add(OnnxNode{"MatMul", {A, B}, {e.out(g, n, 0) + "/mm"}, {}});
    e.add(OnnxNode{"Mul", {e.out(g, n, 0) + "/mm", e.constant(a.alpha)}, {e.out(g, n, 0)}, {}});
  }
}

}  // namespace

KILN_CORE_OPS(gemm) {
  {
    OpDesc d = desc<GemmAttrs>(
        "gemm", [](const OpAttrs& a) { return gemm_arity(OpKind::Gemm, a); }, ref_of<GemmAttrs, gemm_ref>());
    d.grad = gemm_grad;
    d.low_precision = {0, 1};
    d.cases = cases_of(OpKind::Gemm, gemm_cases);
    register_op(OpKind::Gemm, std::move(d));
  }
  {
    OpDesc d = desc<GemmAttrs>(
        "batched_gemm", [](const OpAttrs& a) { return gemm_arity(OpKind::BatchedGemm, a); },
        ref_of<GemmAttrs, batched_gemm_ref>());
    d.grad = gemm_grad;
    d.low_precision = {0, 1};
    d.cases = cases_of(OpKind::BatchedGemm, batched_gemm_cases);
    register_op(OpKind::BatchedGemm, std::move(d));
  }
  add_core_layer("dense", factory<DenseLayer>());
  register_onnx_mapping(OpKind::Gemm, gemm_onnx);
  register_onnx_mapping(OpKind::BatchedGemm, batched_gemm_onnx);
}

}  // namespace kiln::op_impl
