// trainable = false and learning_rate_scale: a frozen layer's weights stay while the others train, with no gradient,
// optimizer state or EMA shadow (the plan shrinks by exactly those bytes) and no activation kept for a weight
// gradient; a frozen batch norm normalizes with its running statistics; tying, clipping, checkpoints and
// data_parallel with frozen layers; a layer's learning_rate_scale multiplies its rate exactly.
#include <catch2/catch.hpp>
#include <cstring>

#include "kiln/op_table.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

// Three dense layers; `mid` is added to the middle one's table.
std::string mlp(const std::string& mid, const std::string& first = "") {
  return "[model]\ninput_shape = [6]\n"
         "[[model.layers]]\nname = \"d1\"\ntype = \"dense\"\nunits = 40\nactivation = \"gelu\"\n" +
         first + "[[model.layers]]\nname = \"d2\"\ntype = \"dense\"\nunits = 30\nactivation = \"tanh\"\n" + mid +
         "[[model.layers]]\nname = \"d3\"\ntype = \"dense\"\nunits = 3\n";
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4) == 0;
}

std::unique_ptr<Runner> single(const ModelSpec& m, const OptimizerSpec& o, CpuDevices& d, int64_t batch) {
  return strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, d.ctx(), batch));
}

std::string model_error(const std::string& toml) {
  try {
    model_from(toml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a frozen layer's weights stay while the others train: no gradient, optimizer state or EMA shadow for it",
          "[frozen]") {
  const ModelSpec m = model_from(mlp("trainable = false\n"));
  REQUIRE_FALSE(m.layers[1].trainable);
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\nema = 0.9\n");
  CpuDevices d(1);
  auto r = single(m, o, d, 8);
  const auto before = r->save_state();
  const auto after = train(*r, m, 8, 3, 3);
  CHECK(same_bits(before.at("d2.kernel"), after.at("d2.kernel")));
  CHECK(same_bits(before.at("d2.bias"), after.at("d2.bias")));
  CHECK_FALSE(same_bits(before.at("d1.kernel"), after.at("d1.kernel")));  // below the frozen layer: trains
  CHECK_FALSE(same_bits(before.at("d3.kernel"), after.at("d3.kernel")));
  // The checkpointed state holds the frozen weights, and no state for them.
  CHECK(after.count("d2.kernel") == 1);
  CHECK(after.count("d1.kernel/adam_m") == 1);
  CHECK(after.count("d1.kernel/ema") == 1);
  for (const char* s : {"d2.kernel/adam_m", "d2.kernel/adam_v", "d2.kernel/ema", "d2.bias/adam_m"}) {
    INFO(s);
    CHECK(after.count(s) == 0);
  }
  // Resume: a fresh runner given that state evaluates as the trained one does (EMA weights and the frozen layer).
  CpuDevices d2(1);
  auto back = single(m, o, d2, 8);
  back->load_state(after);
  const Element e = random_batch(8, m.input_shape, 3, 9);
  for (bool ema : {false, true}) {
    const auto x = r->eval_batch(e, ema), y = back->eval_batch(e, ema);
    CHECK(same_bits(x.outputs.at(0), y.outputs.at(0)));
  }

  // In the graph: d2's parameters are buffers, without gradient or update, and no backward node of d2 reads its
  // input (which only the kernel's gradient would need), while d3's does.
  GraphOptions go;
  go.batch = 8;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  for (auto [p, grad] : g.param_grads) CHECK(g.tensor(p).layer != "d2");
  CHECK(g.param_grads.size() == 4);
  CHECK(g.tensor(g.find("d2.kernel")).role == TensorRole::buffer);
  TensorId d2_in = kNoTensor, d3_in = kNoTensor;
  for (const auto& lo : g.layer_outputs) {
    if (lo.name == "d1") d2_in = lo.out;
    if (lo.name == "d2") d3_in = lo.out;
  }
  bool d2_reads = false, d3_reads = false;
  for (const Node& n : g.nodes()) {
    if (n.phase == Phase::update) CHECK(n.layer != "d2");
    if (n.phase != Phase::backward) continue;
    for (auto t : n.in) {
      d2_reads = d2_reads || (n.layer == "d2" && g.root(t) == g.root(d2_in));
      d3_reads = d3_reads || (n.layer == "d3" && g.root(t) == g.root(d3_in));
    }
  }
  CHECK_FALSE(d2_reads);
  CHECK(d3_reads);
  // A frozen first layer: nothing of it runs backward at all.
  const ModelSpec bottom = model_from(mlp("", "trainable = false\n"));
  const Graph gb = build_graph(bottom, go);
  for (const Node& n : gb.nodes())
    if (n.phase != Phase::forward) CHECK(n.layer != "d1");
}

TEST_CASE("the plan of a frozen layer shrinks by exactly its gradients and Adam's two moments, to the byte",
          "[frozen][memory]") {
  const ModelSpec trained = model_from(mlp("")), frozen = model_from(mlp("trainable = false\n"));
  for (const char* opt : {"[optimizer]\ntype = \"adam\"\n", "[optimizer]\ntype = \"adamw\"\nema = 0.99\n",
                          "[optimizer]\ntype = \"sgd\"\nmomentum = 0.9\n", "[optimizer]\ntype = \"sgd\"\n"}) {
    INFO(opt);
    const OptimizerSpec o = optimizer_from(opt);
    GraphOptions go;
    go.batch = 16;
    go.optimizer = &o;
    const Graph gt = build_graph(trained, go), gf = build_graph(frozen, go);
    const MemoryPlan pt = plan_memory(gt, nullptr), pf = plan_memory(gf, nullptr);
    // d2: kernel (40, 30) = 4800 bytes, 4864 in the planner's 256-byte units; bias (30) = 120, 256.
    const size_t d2 = 4864 + 256;
    const size_t states = o.state_tensors_per_param() + (o.ema_decay > 0 ? 1 : 0);
    const auto tag = [](const MemoryPlan& p, MemoryTag t) { return p.persistent_by_tag[size_t(t)]; };
    CHECK(pt.gradients - pf.gradients == d2);
    CHECK(tag(pt, MemoryTag::optimizer_state) - tag(pf, MemoryTag::optimizer_state) ==
          d2 * o.state_tensors_per_param());
    // The weights are all still there; an EMA shadow is counted with them (its tag is the parameters').
    CHECK(tag(pt, MemoryTag::parameters) - tag(pf, MemoryTag::parameters) == (o.ema_decay > 0 ? d2 : 0));
    CHECK(pf.arena <= pt.arena);
    // What kiln plan prints on its frozen line.
    const FrozenSaving f = frozen_saving(frozen, gf, o, PlanOptions{}.alignment);
    CHECK(f.layers == 1);
    CHECK(f.tensors == 2);
    CHECK(f.values == 40 * 30 + 30);
    CHECK(f.gradient_bytes == d2);
    CHECK(f.bytes() == d2 * (1 + states));
    CHECK(frozen_saving(trained, gt, o, 256).bytes() == 0);
  }
  // Adam: the weights' bytes three times over.
  const OptimizerSpec adam = optimizer_from("[optimizer]\ntype = \"adam\"\n");
  GraphOptions go;
  go.batch = 16;
  go.optimizer = &adam;
  const Graph g = build_graph(frozen, go);
  CHECK(frozen_saving(frozen, g, adam, 256).bytes() == (4864 + 256) * 3);
}

TEST_CASE("a frozen batch norm normalizes with its running statistics in training steps and leaves them alone",
          "[frozen][batch_norm]") {
  const std::string model =
      "[model]\ninput_shape = [3, 2, 2]\nloss = \"mse\"\n"
      "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n";
  const std::string rest =
      "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n[[model.layers]]\nname = \"out\"\ntype = "
      "\"dense\"\nunits = 12\n";
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\n");
  Element e = random_batch(4, Shape{3, 2, 2}, 3, 5);
  for (auto& v : e.x.data) v = v * 3.f + 2.f;  // far from the running statistics' 0 and 1
  e.y = HostTensor(Shape{4, 12});
  for (bool frozen : {false, true}) {
    INFO("frozen " << frozen);
    ModelSpec m = model_from(model + (frozen ? "trainable = false\n" : "") + rest);
    m.label_shape = Shape{12};
    GraphOptions go;
    go.batch = 4;
    go.optimizer = &o;
    const Graph g = build_graph(m, go);
    for (const Node& n : g.nodes())
      if (n.kind == OpKind::BatchNormForward) CHECK(std::get<BatchNormAttrs>(n.attrs).training == !frozen);
    CpuDevices d(1);
    auto r = single(m, o, d, 4);
    const float eval_loss = r->eval_batch(e, false).losses.at(0) / 4.f;  // summed over the examples
    const float train_loss = r->train_step(e, {0, 0.1f}).total_loss;
    const auto s = r->save_state();
    if (frozen) {
      // The training step's forward pass is evaluation's: x normalized by the running statistics (0, 1).
      CHECK(train_loss == Approx(eval_loss).epsilon(1e-6));
      for (float v : s.at("bn.running_mean").data) CHECK(v == 0.f);
      for (float v : s.at("bn.running_var").data) CHECK(v == 1.f);
      for (float v : s.at("bn.gamma").data) CHECK(v == 1.f);
      for (float v : s.at("bn.beta").data) CHECK(v == 0.f);
    } else {
      CHECK(std::fabs(train_loss - eval_loss) > 0.1f * eval_loss);  // batch statistics normalize otherwise
      CHECK(s.at("bn.running_mean").data[0] != 0.f);
    }
  }
}

TEST_CASE(
    "weight tying with frozen layers: a tie to a frozen weight is frozen, freezing only the tying layer is an "
    "error",
    "[frozen][config]") {
  const auto lm = [](const std::string& wte, const std::string& head) {
    return "[model]\ninput_shape = [4]\n"
           "[[model.layers]]\nname = \"wte\"\ntype = \"embedding\"\nvocab = 10\ndim = 6\n" +
           wte + "[[model.layers]]\nname = \"head\"\ntype = \"dense\"\nunits = 10\nuse_bias = false\ntie = \"wte\"\n" +
           head;
  };
  ModelSpec m = model_from(lm("trainable = false\n", ""));
  m.label_shape = Shape{4};
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"adam\"\nlearning_rate = 0.05\n");
  GraphOptions go;
  go.batch = 2;
  go.optimizer = &o;
  CHECK(build_graph(m, go).param_grads.empty());
  CpuDevices d(1);
  auto r = single(m, o, d, 2);
  const auto before = r->save_state();
  Element e;
  e.batch = 2;
  e.x = HostTensor(Shape{2, 4});
  e.y = HostTensor(Shape{2, 4});
  for (size_t i = 0; i < 8; ++i) e.x.data[i] = float(i % 10), e.y.data[i] = float((i + 1) % 10);
  r->train_step(e, {0, 0.05f});
  CHECK(same_bits(before.at("wte.table"), r->save_state().at("wte.table")));

  ModelSpec bad = model_from(lm("", "trainable = false\n"));
  bad.label_shape = Shape{4};
  CHECK_THROWS_WITH(build_graph(bad, go), Catch::Contains("model.toml:14: key 'model.layers[1].trainable'") &&
                                              Catch::Contains("'wte.table' of layer 'wte', which trains") &&
                                              Catch::Contains("set trainable = false on 'wte'"));
  bad.precision.compute = DType::bf16;  // the head reads the table through a bfloat16 cast
  CHECK_THROWS_WITH(build_graph(bad, go), Catch::Contains("'wte.table' of layer 'wte', which trains"));
}

TEST_CASE("clip_norm sums only the gradients that exist, and data_parallel trains a frozen layer as one device does",
          "[frozen][parallel]") {
  // Step 0 runs the same forward pass either way; learning_rate_scale = 0 keeps d2's gradient (in the norm),
  // trainable = false drops it.
  const ModelSpec frozen = model_from(mlp("trainable = false\n")), zero = model_from(mlp("learning_rate_scale = 0\n"));
  const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\nclip_norm = 100.0\n");
  CpuDevices d(2);
  auto rf = strategy("[strategy]\ntype = \"single\"\n")->create(context(frozen, o, d.ctx(0, 1), 8));
  auto rz = strategy("[strategy]\ntype = \"single\"\n")->create(context(zero, o, d.ctx(1, 1), 8));
  const Element e = random_batch(8, frozen.input_shape, 3, 3);
  const float nf = rf->train_step(e, {0, 0.1f}).grad_norm, nz = rz->train_step(e, {0, 0.1f}).grad_norm;
  CHECK(nf > 0.f);
  CHECK(nf < nz);

  const OptimizerSpec sgd = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\nmomentum = 0.9\n");
  const auto ref = single_device(frozen, sgd, 8, 3);
  CpuDevices two(2);
  auto dp = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(frozen, sgd, two.ctx(), 8));
  const auto before = dp->save_state();
  const auto got = train(*dp, frozen, 8, 3, 3);
  CHECK(max_abs_diff(got, ref) < 1e-6);
  CHECK(same_bits(before.at("d2.kernel"), got.at("d2.kernel")));
  CHECK(got.count("d2.kernel/momentum") == 0);

  // Sharded optimizer state (each replica updates its slices itself) applies a layer's learning_rate_scale too.
  const ModelSpec still = model_from(mlp("learning_rate_scale = 0\n"));
  const OptimizerSpec adam = optimizer_from("[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\n");
  CpuDevices sh(2);
  auto sharded = strategy("[strategy]\ntype = \"data_parallel\"\noptimizer_state = \"sharded\"\n")
                     ->create(context(still, adam, sh.ctx(), 8));
  const auto s0 = sharded->save_state();
  const auto s1 = train(*sharded, still, 8, 2, 3);
  CHECK(same_bits(s0.at("d2.kernel"), s1.at("d2.kernel")));
  CHECK_FALSE(same_bits(s0.at("d3.kernel"), s1.at("d3.kernel")));
}

TEST_CASE(
    "learning_rate_scale multiplies a layer's rate: 0 keeps its weights, 0.5 at twice the rate is the rate "
    "bit for bit",
    "[frozen][learning_rate_scale]") {
  // The op's patch: the step's rate times the node's scale, for every optimizer.
  StepScalars s;
  s.lr = 0.3f;
  OpAttrs sg = SgdAttrs{4, 0.f, 0.f, 0.f, false, 0.5f};
  op_desc(OpKind::SgdUpdate).patch(sg, s);
  CHECK(std::get<SgdAttrs>(sg).lr == 0.3f * 0.5f);
  OpAttrs ad = AdamAttrs{4, 0.f, 0.9f, 0.999f, 1e-7f, 0.f, 1, 0.f, 0.25f};
  op_desc(OpKind::AdamUpdate).patch(ad, s);
  CHECK(std::get<AdamAttrs>(ad).lr == 0.3f * 0.25f);
  OpAttrs rm = RmspropAttrs{4, 0.f, 0.9f, 1e-7f, 0.f, 2.f};
  op_desc(OpKind::RmspropUpdate).patch(rm, s);
  CHECK(std::get<RmspropAttrs>(rm).lr == 0.3f * 2.f);

  // 0: the weights stay (Adam's moments still move), the other layers train.
  {
    const ModelSpec m = model_from(mlp("learning_rate_scale = 0\n"));
    const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"adamw\"\nlearning_rate = 0.01\n");
    CpuDevices d(1);
    auto r = single(m, o, d, 8);
    const auto before = r->save_state();
    const auto after = train(*r, m, 8, 3, 3);
    CHECK(same_bits(before.at("d2.kernel"), after.at("d2.kernel")));
    CHECK_FALSE(same_bits(before.at("d2.kernel/adam_m"), after.at("d2.kernel/adam_m")));
    CHECK_FALSE(same_bits(before.at("d3.kernel"), after.at("d3.kernel")));
  }
  // SGD: every layer at 0.5 with the rate 0.2 is the rate 0.1 exactly (0.2f * 0.5f == 0.1f), over several steps.
  const auto run = [](const std::string& scale, float lr, int steps) {
    const std::string k = scale.empty() ? "" : "learning_rate_scale = " + scale + "\n";
    const ModelSpec m = model_from(mlp(k, k) + k);
    const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.1\nmomentum = 0.5\n");
    CpuDevices d(1);
    auto r = single(m, o, d, 8);
    for (int st = 0; st < steps; ++st) r->train_step(random_batch(8, m.input_shape, 3, 100u + st), {st, lr});
    return r->save_state();
  };
  const auto base = run("", 0.1f, 3), half = run("0.5", 0.2f, 3), slow = run("0.5", 0.1f, 3);
  for (const auto& [name, t] : base) {
    INFO(name);
    CHECK(same_bits(t, half.at(name)));
    CHECK_FALSE(same_bits(t, slow.at(name)));
  }
  // One layer at 0.5: after one plain SGD step the others move exactly as at 1, that one half as far (to rounding).
  const auto one_step = [](const std::string& mid) {
    const ModelSpec m = model_from(mlp(mid));
    const OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.5\n");
    CpuDevices d(1);
    auto r = single(m, o, d, 8);
    auto before = r->save_state();
    r->train_step(random_batch(8, m.input_shape, 3, 7), {0, 0.5f});
    return std::pair{before, r->save_state()};
  };
  const auto [w0, full] = one_step("");
  const auto [w0b, part] = one_step("learning_rate_scale = 0.5\n");
  CHECK(same_bits(full.at("d1.kernel"), part.at("d1.kernel")));
  CHECK(same_bits(full.at("d3.kernel"), part.at("d3.kernel")));
  const auto& k0 = w0.at("d2.kernel").data;
  size_t moved = 0;
  for (size_t i = 0; i < k0.size(); ++i) {
    const double df = double(full.at("d2.kernel").data[i]) - k0[i], dp = double(part.at("d2.kernel").data[i]) - k0[i];
    const float big =
        std::max({std::fabs(k0[i]), std::fabs(full.at("d2.kernel").data[i]), std::fabs(part.at("d2.kernel").data[i])});
    CHECK(std::fabs(dp - 0.5 * df) <= 2.0 * (std::nextafter(big, 1e9f) - big));  // two roundings at w's scale
    moved += df != 0;
  }
  CHECK(moved > k0.size() / 2);

  // Keys: out of range, and on a frozen layer.
  CHECK_THAT(
      model_error(mlp("learning_rate_scale = -1\n")),
      Catch::Contains("model.toml:13: key 'model.layers[1].learning_rate_scale'") && Catch::Contains("[0, 1e6]"));
  CHECK_THAT(model_error(mlp("trainable = false\nlearning_rate_scale = 2\n")),
             Catch::Contains("key 'model.layers[1].learning_rate_scale'") && Catch::Contains("trainable = false"));
  CHECK_THAT(model_error(mlp("trainable = 0\n")), Catch::Contains("key 'model.layers[1].trainable'"));
}
