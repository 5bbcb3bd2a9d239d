// Memory savers on the real CPU backend: in-place ops and recomputation change where tensors live, never values.
#include <catch2/catch.hpp>
#include <random>

#include "kiln/config.hpp"
#include "kiln/executor.hpp"
#include "kiln/memory_savers.hpp"
#include "kiln/model.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

ModelSpec model_from(const std::string& toml) { return test::model_from(toml, 11); }

const char* kConvNet = R"(
[model]
input_shape = [2, 8, 8]
[[model.layers]]
name = "c1"
type = "conv2d"
filters = 4
kernel = 3
padding = "same"
activation = "relu"
[[model.layers]]
name = "p1"
type = "max_pool2d"
pool = 2
[[model.layers]]
name = "c2"
type = "conv2d"
filters = 6
kernel = 3
padding = "same"
activation = "tanh"
[[model.layers]]
name = "flat"
type = "flatten"
[[model.layers]]
name = "d1"
type = "dense"
units = 16
activation = "sigmoid"
[[model.layers]]
name = "drop"
type = "dropout"
rate = 0.25
[[model.layers]]
name = "d2"
type = "dense"
units = 16
activation = "relu"
[[model.layers]]
name = "res"
type = "add"
inputs = ["d2", "drop"]
[[model.layers]]
name = "out"
type = "dense"
units = 3
)";

Element batch_of(const ModelSpec& m, int64_t n, uint32_t seed) { return test::random_batch(n, m.input_shape, 3, seed); }

Graph training_graph(const ModelSpec& m, const OptimizerSpec& opt, int64_t batch, const MemorySavers& s) {
  GraphOptions o;
  o.batch = batch;
  o.optimizer = &opt;
  Graph g = build_graph(m, o);
  apply_memory_savers(g, s, true);
  return g;
}

struct Trained {
  std::vector<float> losses;
  std::map<std::string, HostTensor> state;
  MemoryPlan plan;
};

// Three Adam steps from the same initial weights; returns the losses and every persistent tensor.
Trained train(const ModelSpec& m, const MemorySavers& s) {
  auto dev = test::registry().backend("cpu")(BackendOptions{})->open(0);
  Allocator alloc(*dev, AllocatorOptions{});
  DeviceState st(DeviceContext{dev.get(), &alloc}, 5);
  OptimizerSpec adam;
  adam.lr = 0.01;
  Executor ex(training_graph(m, adam, 8, s), st);
  Trained t;
  t.plan = ex.plan();
  for (int step = 0; step < 3; ++step) {
    ex.load_batch(batch_of(m, 8, 100));  // one batch, so the loss must fall
    ex.run({step, 0.01f});
    t.losses.push_back(ex.read_scalar(ex.graph().losses[0]));
  }
  t.state = st.read_all();
  return t;
}

}  // namespace

TEST_CASE("in-place ops and recomputation train bit for bit like the plain plan", "[memory]") {
  ModelSpec m = model_from(kConvNet);
  Trained plain = train(m, MemorySavers{});
  MemorySavers inplace;
  inplace.inplace = true;
  MemorySavers recompute;
  recompute.recompute = RecomputeMode::auto_;
  recompute.checkpoint_every = 2;
  MemorySavers automatic;
  automatic.recompute = RecomputeMode::auto_;
  MemorySavers both = recompute;
  both.inplace = true;
  MemorySavers listed;
  listed.recompute = RecomputeMode::layers;
  listed.recompute_layers = {"c1", "p1", "c2", "d1", "drop"};
  for (const auto* s : {&inplace, &recompute, &automatic, &both, &listed}) {
    INFO(s->describe());
    Trained t = train(m, *s);
    CHECK(t.losses == plain.losses);
    REQUIRE(t.state.size() == plain.state.size());
    for (const auto& [name, h] : plain.state) {
      INFO(name);
      CHECK(t.state.at(name).data == h.data);  // exact: same arithmetic on the same values
    }
    if (s->inplace) CHECK(t.plan.arena < plain.plan.arena);        // sharing storage saves activation memory
    if (s == &automatic) CHECK(t.plan.arena <= plain.plan.arena);  // auto never plans a larger arena
  }
  CHECK(plain.losses[2] < plain.losses[0]);  // the steps did train (same batch each step)
}

TEST_CASE("in-place planning shares storage only along dead inputs and never overlaps live classes", "[memory]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec adam;
  MemorySavers s;
  s.inplace = true;
  Graph g = training_graph(m, adam, 4, s);
  MemoryPlan p = plan_memory(g, nullptr);
  Liveness live = analyze_liveness(g, PlanOptions{});
  const size_t nt = g.tensors().size();
  // The conv output, its bias add and its relu share one storage class.
  const Node* conv = nullptr;
  for (const auto& n : g.nodes())
    if (n.kind == OpKind::Conv2dForward && n.layer == "c1") conv = &n;
  REQUIRE(conv);
  const auto conv_out = size_t(conv->out[0]);
  size_t members = 0;
  for (size_t t = 0; t < nt; ++t)
    if (p.region[t] == Region::arena && g.tensors()[t].alias_of == kNoTensor && size_t(live.rep[t]) == conv_out) {
      ++members;
      CHECK(p.offset[t] == p.offset[conv_out]);
    }
  CHECK(members == 3);
  // Classes alive at the same time never overlap.
  std::vector<size_t> first(nt, SIZE_MAX), last(nt, 0);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const auto* list : {&g.nodes()[i].in, &g.nodes()[i].out})
      for (auto t : *list) {
        auto c = size_t(live.rep[size_t(g.root(t))]);
        first[c] = std::min(first[c], i), last[c] = std::max(last[c], i);
      }
  for (auto t : g.losses) last[size_t(live.rep[size_t(g.root(t))])] = g.nodes().size();
  for (auto t : g.outputs) last[size_t(live.rep[size_t(g.root(t))])] = g.nodes().size();
  size_t classes = 0;
  for (size_t a = 0; a < nt; ++a) {
    if (p.region[a] != Region::arena || g.tensors()[a].alias_of != kNoTensor || size_t(live.rep[a]) != a) continue;
    ++classes;
    for (size_t b = a + 1; b < nt; ++b) {
      if (p.region[b] != Region::arena || g.tensors()[b].alias_of != kNoTensor || size_t(live.rep[b]) != b) continue;
      bool together = !(last[a] < first[b] || last[b] < first[a]);
      bool overlap =
          p.offset[a] < p.offset[b] + g.tensors()[b].bytes() && p.offset[b] < p.offset[a] + g.tensors()[a].bytes();
      INFO("classes " << a << " and " << b);
      CHECK_FALSE((together && overlap));
    }
  }
  CHECK(classes > 5);
}

TEST_CASE("recomputation duplicates forward ops into backward and shrinks a deep net's activation arena", "[memory]") {
  std::string toml = "[model]\ninput_shape = [64]\n";
  for (int i = 0; i < 12; ++i) toml += "[[model.layers]]\ntype = \"dense\"\nunits = 256\nactivation = \"relu\"\n";
  toml += "[[model.layers]]\ntype = \"dense\"\nunits = 10\n";
  ModelSpec m = model_from(toml);
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::sgd;
  Graph plain = training_graph(m, sgd, 512, MemorySavers{});
  MemorySavers s;
  s.recompute = RecomputeMode::auto_;
  s.checkpoint_every = 4;
  Graph rec = training_graph(m, sgd, 512, s);
  // 13 layers, every 4th output kept: dense_4, dense_8 and dense_12 are checkpoints, the other ten recomputed.
  auto layers = recompute_layer_list(rec, s);
  CHECK(layers.size() == 10);
  CHECK(layers.front() == "dense_1");
  CHECK(std::find(layers.begin(), layers.end(), "dense_4") == layers.end());
  size_t forward_in_backward = 0;
  for (const auto& n : rec.nodes())
    if (n.phase == Phase::backward && n.kind == OpKind::ActivationForward) ++forward_in_backward;
  CHECK(forward_in_backward == 9);  // dense_13 (the output) has no activation; the kept ones are not recomputed
  CHECK(rec.nodes().size() > plain.nodes().size());
  MemoryPlan pp = plan_memory(plain, nullptr), pr = plan_memory(rec, nullptr);
  INFO("plain arena " << pp.arena << ", with recomputation " << pr.arena);
  CHECK(double(pr.arena) < 0.7 * double(pp.arena));
  CHECK(pr.gradients == pp.gradients);
  // "auto" plans candidate spacings and keeps the best: never worse than none or a fixed spacing.
  MemorySavers a;
  a.recompute = RecomputeMode::auto_;
  Graph best = training_graph(m, sgd, 512, a);
  CHECK(best.nodes().size() > plain.nodes().size());  // here recomputation pays off, so auto uses it
  CHECK(plan_memory(best, nullptr).arena <= pr.arena);
  // Explicit layers that are not in the model are refused.
  MemorySavers bad;
  bad.recompute = RecomputeMode::layers;
  bad.recompute_layers = {"dense_99"};
  GraphOptions o;
  o.optimizer = &sgd;
  Graph g = build_graph(m, o);
  CHECK_THROWS_WITH(apply_memory_savers(g, bad, true), Catch::Contains("dense_99"));
}
