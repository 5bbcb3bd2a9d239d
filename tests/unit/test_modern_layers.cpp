// The layers a Transformer-style MLP needs: gelu / silu activations, layer norm, global average pooling, AdamW with its
// decay rule, and nanoGPT's schedule (linear warmup, cosine to a floor).
#include <catch2/catch.hpp>
#include <cmath>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

OptimizerSpec optimizer_from(const std::string& toml) {
  auto c = Config::load_string(toml, "run.toml");
  return parse_optimizer(*c.root().table("optimizer"));
}

std::string optimizer_error(const std::string& toml) {
  try {
    optimizer_from(toml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const Node* find_update(const Graph& g, const std::string& param_name) {
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::AdamUpdate && g.tensor(n.out[0]).name == param_name) return &n;
  return nullptr;
}

}  // namespace

TEST_CASE("nanoGPT's learning-rate schedule: linear warmup, then cosine to min_learning_rate", "[schedule]") {
  // shakespeare_char: lr 1e-3, warmup_iters 100, lr_decay_iters 2000, min_lr 1e-4 (decay_steps = 2000 - 100).
  const OptimizerSpec o = optimizer_from(
      "[optimizer]\ntype = \"adamw\"\nlearning_rate = 1e-3\n[optimizer.schedule]\ntype = \"cosine\"\nwarmup_steps = "
      "100\n"
      "decay_steps = 1900\nmin_learning_rate = 1e-4\n");
  auto nanogpt = [](int64_t it) {  // nanoGPT train.py get_lr
    const double lr = 1e-3, min_lr = 1e-4;
    if (it < 100) return lr * double(it + 1) / double(100 + 1);
    if (it > 2000) return min_lr;
    const double ratio = double(it - 100) / double(2000 - 100);
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
  };
  for (int64_t it : {0, 1, 50, 99, 100, 101, 500, 1000, 1999, 2000, 2001, 5000}) {
    INFO("step " << it);
    CHECK(o.learning_rate_at(it) == Approx(nanogpt(it)).epsilon(1e-12));
  }
  // Warmup before a constant schedule too.
  const OptimizerSpec c = optimizer_from("[optimizer]\nlearning_rate = 0.1\n[optimizer.schedule]\nwarmup_steps = 4\n");
  CHECK(c.learning_rate_at(0) == Approx(0.02));
  CHECK(c.learning_rate_at(3) == Approx(0.08));
  CHECK(c.learning_rate_at(4) == Approx(0.1));
}

TEST_CASE("AdamW: PyTorch's defaults, decoupled decay, and the rule for which parameters decay", "[optimizer]") {
  const OptimizerSpec d = optimizer_from("[optimizer]\ntype = \"adamw\"\n");
  CHECK(d.kind == OptimizerKind::adamw);
  CHECK(d.weight_decay == Approx(0.01));
  CHECK(d.eps == Approx(1e-8));
  CHECK(d.decay_params == DecayParams::all);

  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [6]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 4\n"
      "[[model.layers]]\nname = \"ln\"\ntype = \"layer_norm\"\n[[model.layers]]\nname = \"out\"\ntype = "
      "\"dense\"\nunits = 3\n");
  for (const char* rule : {"all", "matrices"}) {
    INFO(rule);
    const OptimizerSpec o = optimizer_from(
        std::string("[optimizer]\ntype = \"adamw\"\nweight_decay = 0.1\ndecay_params = \"") + rule + "\"\n");
    GraphOptions go;
    go.batch = 2;
    go.optimizer = &o;
    const Graph g = build_graph(m, go);
    const Node* kernel = find_update(g, "fc.kernel");
    const Node* bias = find_update(g, "fc.bias");
    const Node* gamma = find_update(g, "ln.gamma");
    REQUIRE(kernel);
    REQUIRE(bias);
    REQUIRE(gamma);
    CHECK(std::get<AdamAttrs>(kernel->attrs).decoupled_decay == Approx(0.1f));
    CHECK(std::get<AdamAttrs>(kernel->attrs).weight_decay == 0.f);  // decoupled, not L2
    const float want = std::string(rule) == "all" ? 0.1f : 0.f;
    CHECK(std::get<AdamAttrs>(bias->attrs).decoupled_decay == want);
    CHECK(std::get<AdamAttrs>(gamma->attrs).decoupled_decay == want);
  }
  // Plain Adam keeps L2 decay in the gradient.
  const OptimizerSpec adam = optimizer_from("[optimizer]\ntype = \"adam\"\nweight_decay = 0.1\n");
  GraphOptions go;
  go.batch = 2;
  go.optimizer = &adam;
  const Graph g = build_graph(m, go);
  REQUIRE(find_update(g, "fc.kernel"));
  CHECK(std::get<AdamAttrs>(find_update(g, "fc.kernel")->attrs).weight_decay == Approx(0.1f));
  CHECK(std::get<AdamAttrs>(find_update(g, "fc.kernel")->attrs).decoupled_decay == 0.f);
}

TEST_CASE("schedule and AdamW keys out of range are config errors naming the key", "[schedule][config]") {
  CHECK_THAT(optimizer_error("[optimizer]\n[optimizer.schedule]\nwarmup_steps = -1\n"),
             Catch::Contains("run.toml") && Catch::Contains("warmup_steps"));
  CHECK_THAT(
      optimizer_error(
          "[optimizer]\nlearning_rate = 1e-3\n[optimizer.schedule]\ntype = \"cosine\"\nmin_learning_rate = 1e-2\n"),
      Catch::Contains("min_learning_rate") && Catch::Contains("learning_rate"));
  CHECK_THAT(
      optimizer_error("[optimizer]\n[optimizer.schedule]\ntype = \"cosine\"\nmin_learning_rate = 1e-5\nalpha = 0.1\n"),
      Catch::Contains("min_learning_rate") && Catch::Contains("once"));
  CHECK_THAT(optimizer_error("[optimizer]\ntype = \"adamw\"\ndecay_params = \"weights\"\n"),
             Catch::Contains("decay_params") && Catch::Contains("matrices"));
  CHECK(optimizer_error(
            "[optimizer]\ntype = \"adamw\"\ndecay_params = \"matrices\"\n[optimizer.schedule]\ntype = \"cosine\"\n"
            "warmup_steps = 100\nmin_learning_rate = 1e-4\n") == "");
}

TEST_CASE("gelu, silu, layer_norm and global_avg_pool2d build the ops PyTorch users expect", "[graph][layers]") {
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [2, 3, 5]\n"
      "[[model.layers]]\nname = \"gap\"\ntype = \"global_avg_pool2d\"\n"
      "[[model.layers]]\nname = \"ln\"\ntype = \"layer_norm\"\nuse_bias = false\nepsilon = 1e-6\n"
      "[[model.layers]]\nname = \"g\"\ntype = \"gelu\"\napproximate = \"tanh\"\n"
      "[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 4\nactivation = \"silu\"\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
  OptimizerSpec o;
  GraphOptions go;
  go.batch = 7;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  bool pool = false, ln = false, gelu_tanh = false, silu = false, silu_back_reads_x = false;
  for (const Node& n : g.nodes()) {
    if (n.kind == OpKind::AvgPoolForward) {
      const auto& a = std::get<PoolAttrs>(n.attrs);
      pool = a.kh == 3 && a.kw == 5 && a.oh == 1 && a.ow == 1;
    }
    if (n.kind == OpKind::LayerNormForward) {
      const auto& a = std::get<LayerNormAttrs>(n.attrs);
      ln = a.rows == 7 && a.cols == 2 && !a.bias && a.eps == Approx(1e-6f) && n.in.size() == 2;
    }
    if (n.kind == OpKind::ActivationForward) {
      const auto act = std::get<ActivationAttrs>(n.attrs).act;
      gelu_tanh = gelu_tanh || act == Activation::gelu_tanh;
      silu = silu || act == Activation::silu;
    }
    if (n.kind == OpKind::ActivationBackward && std::get<ActivationAttrs>(n.attrs).act == Activation::silu) {
      // silu's gradient reads the forward input (the dense output), not the activation's output
      for (const Node& f : g.nodes())
        if (f.kind == OpKind::ActivationForward && std::get<ActivationAttrs>(f.attrs).act == Activation::silu)
          silu_back_reads_x = n.in[0] == f.in[0];
    }
  }
  CHECK(pool);
  CHECK(ln);
  CHECK(gelu_tanh);
  CHECK(silu);
  CHECK(silu_back_reads_x);
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"layer_norm\"\nepsilon = 0.0\n"),
      Catch::Contains("epsilon"));
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"gelu\"\napproximate = \"erf\"\n"),
      Catch::Contains("approximate"));
}

TEST_CASE("embedding, positional_embedding and dense over positions build a GPT's input and projection",
          "[graph][layers]") {
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [5]\n"
      "[[model.layers]]\nname = \"wte\"\ntype = \"embedding\"\nvocab = 11\ndim = 8\ninit_std = 0.02\n"
      "[[model.layers]]\nname = \"wpe\"\ntype = \"positional_embedding\"\ninit_std = 0.02\n"
      "[[model.layers]]\nname = \"ln\"\ntype = \"layer_norm\"\n"
      "[[model.layers]]\nname = \"head\"\ntype = \"dense\"\nunits = 11\nuse_bias = false\n"
      "[[model.layers]]\ntype = \"flatten\"\n");
  OptimizerSpec o;
  GraphOptions go;
  go.batch = 3;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  bool embed = false, pos = false, head = false;
  for (const Node& n : g.nodes()) {
    if (n.kind == OpKind::EmbeddingForward) {
      const auto& a = std::get<EmbeddingAttrs>(n.attrs);
      embed = a.rows == 15 && a.vocab == 11 && a.dim == 8;
    }
    if (n.kind == OpKind::BiasAdd && g.tensor(n.in[1]).name == "wpe.table") {
      const auto& a = std::get<BiasAttrs>(n.attrs);
      pos = a.outer == 3 && a.channels == 40 && g.tensor(n.in[1]).shape.numel() == 40;
    }
    if (n.kind == OpKind::Gemm && g.tensor(n.in[1]).name == "head.kernel") {
      const auto& a = std::get<GemmAttrs>(n.attrs);
      head = head || (a.m == 15 && a.n == 11 && a.k == 8 && !a.trans_a && !a.trans_b);  // the forward gemm
    }
  }
  CHECK(embed);
  CHECK(pos);
  CHECK(head);
  CHECK_THROWS_WITH(
      test::model_from("[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"embedding\"\nvocab = 0\ndim = 4\n"),
      Catch::Contains("vocab"));
  CHECK_THROWS_WITH(
      test::model_from(
          "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"embedding\"\nvocab = 20000000\ndim = 4\n"),
      Catch::Contains("2^24"));
}

TEST_CASE("tie shares an embedding table with a dense layer's transposed kernel (nanoGPT's lm_head)",
          "[graph][layers]") {
  const std::string base =
      "[model]\ninput_shape = [5]\n"
      "[[model.layers]]\nname = \"wte\"\ntype = \"embedding\"\nvocab = 11\ndim = 8\ninit_std = 0.02\n";
  ModelSpec m =
      test::model_from(base +
                       "[[model.layers]]\nname = \"head\"\ntype = \"dense\"\ntie = \"wte\"\nuse_bias = false\n"
                       "[[model.layers]]\ntype = \"flatten\"\n");
  OptimizerSpec o;
  GraphOptions go;
  go.batch = 3;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  CHECK(g.find("head.kernel") == kNoTensor);
  const TensorId table = g.find("wte.table");
  REQUIRE(table != kNoTensor);
  bool tied_gemm = false;
  int table_updates = 0, table_grad_parts = 0;
  for (const Node& n : g.nodes()) {
    if (n.kind == OpKind::Gemm && n.phase == Phase::forward && n.in[1] == table) {
      const auto& a = std::get<GemmAttrs>(n.attrs);
      tied_gemm = a.m == 15 && a.n == 11 && a.k == 8 && a.trans_b;
    }
    if (n.kind == OpKind::AdamUpdate && n.out[0] == table) ++table_updates;
  }
  for (const auto& [p, grad] : g.param_grads)
    if (p == table)
      for (const Node& n : g.nodes())  // the table's gradient is the sum of the embedding's and the head's
        if (!n.out.empty() && n.out[0] == grad && n.kind == OpKind::Add) ++table_grad_parts;
  CHECK(tied_gemm);
  CHECK(table_updates == 1);
  CHECK(table_grad_parts >= 1);
  CHECK_THROWS_WITH(
      build_graph(test::model_from(base + "[[model.layers]]\nname = \"head\"\ntype = \"dense\"\ntie = \"nope\"\n"), go),
      Catch::Contains("tie") && Catch::Contains("nope.table"));
  CHECK_THROWS_WITH(
      build_graph(
          test::model_from(base + "[[model.layers]]\nname = \"head\"\ntype = \"dense\"\ntie = \"wte\"\nunits = 12\n"),
          go),
      Catch::Contains("units = 12") && Catch::Contains("11 rows"));
}
