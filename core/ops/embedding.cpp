// Embedding lookup: rows of a (vocab, dim) table picked by token ids, and the table's gradient (rows summed per
// id). The ids are data, never differentiated. Semantics: ops.hpp.
// Also the embedding layer that emits it, and positional_embedding (a bias_add of a learned table).
#include <cmath>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity embedding_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<EmbeddingAttrs>(op, attrs);
  check_dims(op, {{"rows", a.rows}, {"vocab", a.vocab}, {"dim", a.dim}});
  const int64_t table = product(op, {a.vocab, a.dim}), rows = product(op, {a.rows, a.dim});
  if (k == OpKind::EmbeddingForward) return {{a.rows, table}, {rows}};
  return {{a.rows, rows}, {table}};
}

void embedding_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::EmbeddingBackward, n.attrs, {n.in[0], g.dy()});
}

// An id names a row when it is an integer in [0, vocab); -1 otherwise.
int64_t embedding_row(float id, int64_t vocab) {
  if (!(id >= 0.f) || id != std::floor(id) || id >= static_cast<float>(vocab)) return -1;
  return static_cast<int64_t>(id);
}

void embedding_ref(OpKind k, const EmbeddingAttrs& a, In in, Out out) {
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

void embedding_cases(Table& t) {
  struct E {
    int64_t rows, vocab, dim;
    bool large;
  };
  // Character-model sizes (65 x 128, 12 x 64 tokens), a vocabulary of 1, rows of 1, tails around 256, long rows.
  for (const E e : {E{1, 1, 1, false}, E{7, 5, 3, false}, E{768, 65, 128, false}, E{257, 300, 17, false},
                    E{70000, 3, 2, true}, E{64, 50257, 8, true}}) {
    const EmbeddingAttrs a{e.rows, e.vocab, e.dim};
    const std::string v = str(e.rows) + "x" + str(e.vocab) + "x" + str(e.dim);
    const Gen ids{Gen::labels, 0, float(e.vocab)};
    t.add(v + ".int", OpKind::EmbeddingForward, a, {ids, kI}, {kOut}, Check::elementwise, true).large = e.large;
    t.add(v + ".int", OpKind::EmbeddingBackward, a, {ids, kI}, {kOut}, Check::reduction, true).large = e.large;
    if (!e.large) t.add(v + ".float", OpKind::EmbeddingBackward, a, {ids, kF}, {kOut}, Check::reduction, false);
  }
  // An id out of range gives a row of NaN forward and is skipped backward.
  t.add("4x10x3.bad_id", OpKind::EmbeddingForward, EmbeddingAttrs{4, 10, 3}, {{Gen::labels_bad, 0, 10.f}, kI}, {kOut},
        Check::elementwise, true);
  t.add("4x10x3.bad_id", OpKind::EmbeddingBackward, EmbeddingAttrs{4, 10, 3}, {{Gen::labels_bad, 0, 10.f}, kI}, {kOut},
        Check::reduction, true);
  t.grad("12x9x5", OpKind::EmbeddingForward, EmbeddingAttrs{12, 9, 5}, {{Gen::labels, 0, 9.f}, kF}, {kOut},
         Check::elementwise);
}

// ---- the layers --------------------------------------------------------------------------------------------

// PyTorch's nn.Embedding(vocab, dim): token ids (integers stored as floats) -> rows of a learned table, N(0,
// init_std^2) at start (PyTorch's default 1; nanoGPT uses 0.02). An id outside [0, vocab) gives a row of NaN, which the
// run's finiteness checks report.
class EmbeddingLayer : public Layer {
 public:
  explicit EmbeddingLayer(const ConfigNode& c)
      : vocab_(c.get_int("vocab")),
        dim_(c.get_int("dim")),
        std_(c.get_float("init_std", 1.0)),
        where_(c.where("vocab")) {
    if (vocab_ <= 0) c.fail("vocab", "expected a positive vocabulary size, found " + std::to_string(vocab_));
    if (vocab_ >= (int64_t{1} << 24)) c.fail("vocab", "ids travel as float32: at most 2^24 - 1 ids are exact");
    if (dim_ <= 0) c.fail("dim", "expected a positive embedding width, found " + std::to_string(dim_));
    if (!(std_ > 0) || !std::isfinite(std_)) c.fail("init_std", "expected a positive, finite standard deviation");
    c.finish();
  }
  std::string type() const override { return "embedding"; }
  // ids (N, ...) -> (N, ..., dim)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    std::vector<int64_t> od = s.dims();
    od.push_back(dim_);
    const Shape out(od);
    check_size(g, {vocab_, dim_}, "table (vocab, dim)", where_);
    check_size(g, out, "output", where_);
    TensorId table = g.param("table", {vocab_, dim_}, Init{InitKind::normal, vocab_, dim_, static_cast<float>(std_)});
    return g.op1(OpKind::EmbeddingForward, EmbeddingAttrs{s.numel(), vocab_, dim_}, {in[0], table}, out);
  }

 private:
  int64_t vocab_, dim_;
  double std_;
  std::string where_;
};

// Learned positional embeddings (GPT-2, nanoGPT's wpe): x (N, T, D) + table (T, D), the same table for every example.
class PositionalEmbeddingLayer : public Layer {
 public:
  explicit PositionalEmbeddingLayer(const ConfigNode& c) : std_(c.get_float("init_std", 1.0)) {
    if (!(std_ > 0) || !std::isfinite(std_)) c.fail("init_std", "expected a positive, finite standard deviation");
    c.finish();
  }
  std::string type() const override { return "positional_embedding"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 3)
      shape_error(g, "positional_embedding expects input (batch, positions, features), got " + s.str());
    const int64_t t = s[1], d = s[2];
    TensorId table = g.param("table", {t, d}, Init{InitKind::normal, t, d, static_cast<float>(std_)});
    return g.op1(OpKind::BiasAdd, BiasAttrs{s[0], t * d, 1}, {in[0], table}, s);
  }

 private:
  double std_;
};

// ONNX: the ids travel as floats; Cast to int64, then Gather rows of the table.
void embedding_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  e.add(OnnxNode{"Cast", {e.in(g, n, 0)}, {e.out(g, n, 0) + "/ids"}, {}}.i("to", kOnnxInt64));
  e.add(OnnxNode{"Gather", {e.in(g, n, 1), e.out(g, n, 0) + "/ids"}, {e.out(g, n, 0)}, {}}.i("axis", 0));
}

}  // namespace

KILN_CORE_OPS(embedding) {
  for (auto [k, name] : {std::pair{OpKind::EmbeddingForward, "embedding_forward"},
                         std::pair{OpKind::EmbeddingBackward, "embedding_backward"}}) {
    OpDesc d = desc<EmbeddingAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return embedding_arity(k, name, a); },
        ref_of<EmbeddingAttrs, embedding_ref>(k));
    d.data_inputs = {0};
    if (k == OpKind::EmbeddingForward) d.grad = embedding_grad;
    d.cases = cases_of(k, embedding_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("embedding", factory<EmbeddingLayer>());
  add_core_layer("positional_embedding", factory<PositionalEmbeddingLayer>());
  register_onnx_mapping(OpKind::EmbeddingForward, embedding_onnx);
}

}  // namespace kiln::op_impl
