// Batch normalization: the op against PyTorch's numbers, the running statistics as buffers (updated in
// training, read in evaluation, checkpointed, never trained), the layer's keys, and a conv + batch-norm model that
// learns on every backend present.
//
// PyTorch's numbers come from /usr/bin/python3 (torch, float64):
//   bn = torch.nn.BatchNorm2d(3, momentum=0.1, eps=1e-5).double()
//   x1 = torch.tensor([float((i * 7) % 11) - 5.0 for i in range(24)]).double().reshape(2, 3, 2, 2)
//   x2 = torch.tensor([float((i * 5) % 13) * 0.5 - 3.0 for i in range(24)]).double().reshape(2, 3, 2, 2)
//   bn.weight = [1.5, 0.5, -1.0]; bn.bias = [0.25, -0.5, 1.0]  (or the defaults 1 and 0 where said)
//   bn.train(); y1 = bn(x1); bn(x2); bn.eval(); yeval = bn(x1)   (running_mean, running_var printed after each)
//   b1 = torch.nn.BatchNorm1d(2, momentum=0.3, eps=1e-3).double(); y = b1(x) for the 5x2 x below
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <vector>

#include "kiln/checkpoint.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/evaluation.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "kiln/strategy.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

std::vector<float> x1_values() {
  std::vector<float> v;
  for (int i = 0; i < 24; ++i) v.push_back(float((i * 7) % 11) - 5.f);
  return v;
}
std::vector<float> x2_values() {
  std::vector<float> v;
  for (int i = 0; i < 24; ++i) v.push_back(float((i * 5) % 13) * 0.5f - 3.f);
  return v;
}

const std::vector<double> kY1 = {-2.35795367, 0.81694645,  -0.99728219, 2.17761793,  -0.30544815, -0.99718806,
                                 0.21335678,  -0.47838313, 1.93704211,  -0.24938949, 1.0,         2.24938949,
                                 0.81694645,  -0.99728219, 2.17761793,  0.36338929,  -0.99718806, 0.21335678,
                                 -0.47838313, -1.17012304, -0.24938949, 1.0,         2.24938949,  0.06295789};
const std::vector<double> kRm1 = {0.075, -0.0125, -0.1}, kRv1 = {2.15, 1.855357142857143, 2.0714285714285716};
const std::vector<double> kRm2 = {0.0175, 0.045, -0.09},
                          kRv2 = {2.3564285714285713, 2.0158035714285716, 2.285714285714286};
const std::vector<double> kYEval = {-4.65287227, 2.18720862,  -1.72140903, 5.11867186,  -0.16368349, -1.57233904,
                                    0.89280818,  -0.51584738, 3.58621625,  -1.04383842, 1.60190711,  4.24765263,
                                    2.18720862,  -1.72140903, 5.11867186,  1.21005421,  -1.57233904, 0.89280818,
                                    -0.51584738, -1.92450293, -1.04383842, 1.60190711,  4.24765263,  -0.38240204};
// gamma 1, beta 0 (the layer's initial values), after the two training batches.
const std::vector<double> kYEvalDefault = {-3.26858151, 1.29147242,  -1.31427269, 3.24578124,  0.67263303,  -2.14467809,
                                           2.78561637,  -0.03169475, -2.58621625, 2.04383842,  -0.60190711, -3.24765263,
                                           1.29147242,  -1.31427269, 3.24578124,  0.64003614,  -2.14467809, 2.78561637,
                                           -0.03169475, -2.84900587, 2.04383842,  -0.60190711, -3.24765263, 1.38240204};

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(double(got[i]) - want[i]) <= tol * (1.0 + std::fabs(want[i])));
  }
}

struct Forward {
  std::vector<float> y, mean, rstd, running_mean, running_var;
};
Forward run_reference(const BatchNormAttrs& a, const std::vector<float>& x, const std::vector<float>& gamma,
                      const std::vector<float>& beta, std::vector<float> rm, std::vector<float> rv) {
  Forward f;
  f.y.resize(x.size());
  f.mean.resize(size_t(a.c));
  f.rstd.resize(size_t(a.c));
  f.running_mean = std::move(rm);
  f.running_var = std::move(rv);
  const float* in[] = {x.data(), gamma.data(), beta.data()};
  float* out[] = {f.y.data(), f.mean.data(), f.rstd.data(), f.running_mean.data(), f.running_var.data()};
  reference_op(OpKind::BatchNormForward, a, in, out);
  return f;
}

const char* kBnModel =
    "[model]\ninput_shape = [3, 2, 2]\nloss = \"mse\"\n"
    "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n"
    "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n";

OptimizerSpec sgd() {
  auto c = Config::load_string("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\n", "run.toml");
  return parse_optimizer(*c.root().table("optimizer"));
}

std::unique_ptr<Runner> single_runner(const ModelSpec& m, const OptimizerSpec& o, Device& dev, Allocator& alloc,
                                      int64_t batch) {
  auto cfg = Config::load_string("[strategy]\ntype = \"single\"\n", "strategy.toml");
  auto table = cfg.root().table("strategy");
  auto strategy = test::registry().strategy(table->get_string("type"))(*table);
  RunnerContext c;
  c.model = &m;
  c.optimizer = &o;
  c.devices = {{&dev, &alloc}};
  c.global_batch = batch;
  c.seed = 11;
  return strategy->create(c);
}

Element batch_of(const std::vector<float>& x) {
  Element e;
  e.batch = 2;
  e.x = HostTensor(Shape{2, 3, 2, 2});
  e.x.data = x;
  e.y = HostTensor(Shape{2, 12});
  return e;
}

std::string layer_error(const std::string& keys, const std::string& input = "[3, 4, 4]") {
  try {
    test::model_from("[model]\ninput_shape = " + input + "\n[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n" +
                     keys);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("batch_norm_forward matches PyTorch's BatchNorm2d in training and evaluation, running statistics included",
          "[batch_norm]") {
  const BatchNormAttrs train{2, 3, 4, 1e-5f, 0.1f, true};
  const std::vector<float> gamma{1.5f, 0.5f, -1.f}, beta{0.25f, -0.5f, 1.f};
  Forward f1 = run_reference(train, x1_values(), gamma, beta, {0, 0, 0}, {1, 1, 1});
  check_close(f1.y, kY1, 1e-6);
  check_close(f1.running_mean, kRm1, 1e-6);
  check_close(f1.running_var, kRv1, 1e-6);  // unbiased: m / (m - 1) = 8 / 7
  Forward f2 = run_reference(train, x2_values(), gamma, beta, f1.running_mean, f1.running_var);
  check_close(f2.running_mean, kRm2, 1e-6);
  check_close(f2.running_var, kRv2, 1e-6);
  BatchNormAttrs eval = train;
  eval.training = false;
  Forward fe = run_reference(eval, x1_values(), gamma, beta, f2.running_mean, f2.running_var);
  check_close(fe.y, kYEval, 1e-6);
  check_close(fe.running_mean, kRm2, 1e-6);  // evaluation leaves them as they were
  check_close(fe.running_var, kRv2, 1e-6);
  check_close(fe.mean, kRm2, 1e-6);
}

TEST_CASE("batch_norm_forward on (N, F) input matches PyTorch's BatchNorm1d, by hand and with momentum 0.3",
          "[batch_norm]") {
  // Feature 0: x = 1, 2, 4, -1, 0.5: mean 1.3, biased var 2.76, unbiased 3.45.
  const std::vector<float> x{1.f, -2.f, 2.f, 0.5f, 4.f, 1.f, -1.f, 3.f, 0.5f, 0.f};
  Forward f = run_reference(BatchNormAttrs{5, 2, 1, 1e-3f, 0.3f, true}, x, {1.f, 1.f}, {0.f, 0.f}, {0, 0}, {1, 1});
  check_close(f.mean, {1.3, 0.5}, 1e-6);
  check_close(f.rstd, {1.0 / std::sqrt(2.76 + 1e-3), 1.0 / std::sqrt(2.6 + 1e-3)}, 1e-6);
  check_close(f.running_mean, {0.39, 0.15}, 1e-6);   // 0.7 * 0 + 0.3 * mean
  check_close(f.running_var, {1.735, 1.675}, 1e-6);  // 0.7 * 1 + 0.3 * 3.45; 0.7 + 0.3 * 3.25
  check_close(f.y,
              {-0.18054607, -1.55013611, 0.42127417, 0.0, 1.62491467, 0.31002722, -1.38418657, 1.55013611, -0.4814562,
               -0.31002722},
              1e-6);
}

TEST_CASE("batch_norm_backward: dgamma and dbeta are the channel sums, dx sums to zero per channel in training",
          "[batch_norm]") {
  const BatchNormAttrs a{2, 3, 4, 1e-5f, 0.1f, true};
  const std::vector<float> gamma{1.5f, 0.5f, -1.f}, beta{0.f, 0.f, 0.f};
  const std::vector<float> x = x1_values();
  Forward f = run_reference(a, x, gamma, beta, {0, 0, 0}, {1, 1, 1});
  std::vector<float> dy(24), dx(24), dgamma(3), dbeta(3);
  for (int i = 0; i < 24; ++i) dy[size_t(i)] = float(i % 5) - 2.f;
  const float* in[] = {x.data(), gamma.data(), f.mean.data(), f.rstd.data(), dy.data()};
  float* out[] = {dx.data(), dgamma.data(), dbeta.data()};
  reference_op(OpKind::BatchNormBackward, a, in, out);
  for (int c = 0; c < 3; ++c) {
    double sdy = 0, sdyx = 0, sdx = 0;
    for (int o = 0; o < 2; ++o)
      for (int i = 0; i < 4; ++i) {
        const size_t j = size_t((o * 3 + c) * 4 + i);
        sdy += dy[j];
        sdyx += double(dy[j]) * (x[j] - f.mean[size_t(c)]) * f.rstd[size_t(c)];
        sdx += dx[j];
      }
    CHECK(dbeta[size_t(c)] == Approx(sdy).margin(1e-6));
    CHECK(dgamma[size_t(c)] == Approx(sdyx).margin(1e-5));
    CHECK(std::fabs(sdx) < 1e-5);  // the mean's gradient removes the per-channel mean of dx
  }
}

TEST_CASE(
    "the batch_norm layer: buffers for the running statistics, evaluation graphs use them, the optimizer never "
    "touches them",
    "[batch_norm]") {
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [3, 4, 4]\n"
      "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\nuse_bias = "
      "false\n"
      "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\nmomentum = 0.2\nepsilon = 1e-3\n"
      "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
  const OptimizerSpec o = sgd();
  GraphOptions go;
  go.batch = 5;
  go.optimizer = &o;
  const Graph g = build_graph(m, go);
  const Node* fwd = nullptr;
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::BatchNormForward) fwd = &n;
  REQUIRE(fwd != nullptr);
  const auto& a = std::get<BatchNormAttrs>(fwd->attrs);
  CHECK(a.n == 5);
  CHECK(a.c == 4);
  CHECK(a.inner == 16);
  CHECK(a.momentum == Approx(0.2f));
  CHECK(a.eps == Approx(1e-3f));
  CHECK(a.training);
  REQUIRE(fwd->out.size() == 5);
  CHECK(g.tensor(fwd->out[3]).name == "bn.running_mean");
  CHECK(g.tensor(fwd->out[3]).role == TensorRole::buffer);
  CHECK(g.tensor(fwd->out[4]).name == "bn.running_var");
  CHECK(g.tensor(fwd->out[4]).init.kind == InitKind::ones);
  CHECK(g.tensor(fwd->in[1]).role == TensorRole::parameter);  // gamma
  // Parameters get gradients and updates; the buffers get neither.
  for (auto [p, grad] : g.param_grads) CHECK(g.tensor(p).name.find("running") == std::string::npos);
  for (const Node& n : g.nodes())
    if (n.phase == Phase::update)
      for (auto t : n.out) CHECK(g.tensor(t).role != TensorRole::buffer);
  // The planner counts them as persistent state.
  const MemoryPlan p = plan_memory(g, nullptr);
  size_t expected = 0;
  for (const auto& t : g.tensors())
    if (role_persistent(t.role) && t.alias_of == kNoTensor && role_tag(t.role) == MemoryTag::parameters)
      expected += aligned_size(t.bytes());
  CHECK(p.persistent_by_tag[size_t(MemoryTag::parameters)] == expected);

  GraphOptions eo;
  eo.batch = 1;  // evaluation: one example is fine (the running statistics are used)
  eo.training = false;
  const Graph e = build_graph(m, eo);
  for (const Node& n : e.nodes())
    if (n.kind == OpKind::BatchNormForward) CHECK_FALSE(std::get<BatchNormAttrs>(n.attrs).training);
  // affine = false: gamma and beta are constant buffers.
  ModelSpec na = test::model_from(
      "[model]\ninput_shape = [6]\n[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\naffine = false\n");
  const Graph gn = build_graph(na, go);
  for (const auto& t : gn.tensors()) CHECK(t.role != TensorRole::parameter);
}

TEST_CASE(
    "batch_norm keys out of range, unknown keys, a non-boolean sync and unsupported ranks are config errors naming the "
    "key",
    "[batch_norm][config]") {
  CHECK_THAT(layer_error("momentum = 1.5\n"), Catch::Contains("model.layers[0].momentum") && Catch::Contains("[0, 1]"));
  CHECK_THAT(layer_error("epsilon = 0\n"), Catch::Contains("model.layers[0].epsilon"));
  CHECK_THAT(layer_error("epsilon = -1e-5\n"), Catch::Contains("model.layers[0].epsilon"));
  CHECK_THAT(layer_error("momentun = 0.1\n"), Catch::Contains("momentun"));
  CHECK_THAT(layer_error("affine = 3\n"), Catch::Contains("affine"));
  CHECK_THAT(layer_error("sync = 1\n"), Catch::Contains("model.layers[0].sync"));
  CHECK(layer_error("sync = true\n").empty());  // tests/unit/test_sync_batch_norm.cpp
  CHECK(layer_error("sync = false\n").empty());
  CHECK(layer_error("momentum = 0\nepsilon = 1e-3\naffine = false\n").empty());
  CHECK(layer_error("", "[6]").empty());

  ModelSpec seq =
      test::model_from("[model]\ninput_shape = [4, 6]\n[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n");
  GraphOptions go;
  go.batch = 2;
  CHECK_THROWS_WITH(build_graph(seq, go),
                    Catch::Contains("layer 'bn'") && Catch::Contains("(batch, channels, height, width)"));
  // Training on one value per channel is refused, as PyTorch refuses it.
  ModelSpec flat =
      test::model_from("[model]\ninput_shape = [6]\n[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n");
  go.batch = 1;
  CHECK_THROWS_WITH(build_graph(flat, go), Catch::Contains("more than one value per channel"));
}

TEST_CASE(
    "batch norm on the CPU backend: PyTorch's running statistics after two steps, evaluation reads them, and a "
    "checkpoint restores them",
    "[batch_norm]") {
  auto& reg = test::registry();
  auto backend = reg.backend("cpu")(BackendOptions::parse("threads = 1"));
  auto dev = backend->open(0);
  AllocatorOptions ao;
  ao.limit = 256ull << 20;
  Allocator alloc(*dev, ao);
  ModelSpec m = test::model_from(kBnModel);
  const OptimizerSpec o = sgd();
  auto r = single_runner(m, o, *dev, alloc, 2);
  r->train_step(batch_of(x1_values()), {0, 0.f});  // lr 0: gamma and beta stay 1 and 0
  auto s1 = r->save_state();
  check_close(s1.at("bn.running_mean").data, kRm1, 1e-6);
  check_close(s1.at("bn.running_var").data, kRv1, 1e-6);
  r->train_step(batch_of(x2_values()), {1, 0.f});
  auto s2 = r->save_state();
  check_close(s2.at("bn.running_mean").data, kRm2, 1e-6);
  check_close(s2.at("bn.running_var").data, kRv2, 1e-6);
  EvalResult e = r->eval_batch(batch_of(x1_values()), false);
  check_close(e.outputs.at(0).data, kYEvalDefault, 1e-5);
  // Evaluation did not move them.
  check_close(r->save_state().at("bn.running_var").data, kRv2, 1e-6);

  // Through a checkpoint file into a fresh runner: the same running statistics, the same evaluation.
  const auto dir = test::temp_dir("bn-ckpt");
  Checkpoint c;
  c.step = 2;
  c.tensors = s2;
  save_checkpoint((dir / "ckpt.bin").string(), c);
  Checkpoint back = load_checkpoint((dir / "ckpt.bin").string());
  REQUIRE(back.tensors.count("bn.running_mean") == 1);
  auto fresh = single_runner(m, o, *dev, alloc, 2);
  check_close(fresh->save_state().at("bn.running_var").data, {1, 1, 1}, 0);  // PyTorch's initial values
  check_close(fresh->save_state().at("bn.running_mean").data, {0, 0, 0}, 0);
  fresh->load_state(back.tensors);
  check_close(fresh->eval_batch(batch_of(x1_values()), false).outputs.at(0).data, kYEvalDefault, 1e-5);
  // EMA evaluation reads the live running statistics (only parameters have shadows).
  auto ce = Config::load_string("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nema = 0.9\n", "run.toml");
  const OptimizerSpec oe = parse_optimizer(*ce.root().table("optimizer"));
  auto re = single_runner(m, oe, *dev, alloc, 2);
  re->load_state(back.tensors);
  auto st = re->save_state();
  CHECK(st.count("bn.running_mean/ema") == 0);
  check_close(re->eval_batch(batch_of(x1_values()), true).outputs.at(0).data, kYEvalDefault, 1e-5);
}

TEST_CASE("a conv + batch-norm model learns on every backend present, and its running statistics match the CPU's",
          "[batch_norm][backends]") {
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [2, 6, 6]\n"
      "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\nuse_bias = "
      "false\n"
      "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n"
      "[[model.layers]]\nname = \"act\"\ntype = \"activation\"\nfunction = \"relu\"\n"
      "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
  const OptimizerSpec o = sgd();
  const Element batch = test::random_batch(16, m.input_shape, 3, 5);
  std::map<std::string, std::vector<float>> running;
  int ran = 0;
  for (const std::string name : {"cpu", "vulkan", "cuda"}) {
    auto& reg = test::registry();
    if (!reg.has_backend(name)) continue;
    auto backend = reg.backend(name)(BackendOptions::parse(name == "vulkan" ? "validation = true" : ""));
    if (backend->enumerate().empty()) continue;
    INFO("backend " << name);
    auto dev = backend->open(0);
    AllocatorOptions ao;
    ao.limit = 256ull << 20;
    Allocator alloc(*dev, ao);
    auto r = single_runner(m, o, *dev, alloc, 16);
    std::vector<float> losses;
    for (int s = 0; s < 40; ++s) losses.push_back(r->train_step(batch, {s, 0.05f}).total_loss);
    CHECK(losses.back() < 0.5f * losses.front());
    auto st = r->save_state();
    running[name] = st.at("bn.running_var").data;
    ++ran;
  }
  REQUIRE(running.count("cpu"));
  for (const auto& [name, v] : running) {
    INFO("backend " << name);
    check_close(v, std::vector<double>(running["cpu"].begin(), running["cpu"].end()), 1e-3);
  }
  if (ran < 2) WARN("only the cpu backend has a device here: batch norm trained on it alone");
}

TEST_CASE(
    "data_parallel batch norm: each replica normalizes with its own rows, replica 0's running statistics are "
    "saved, evaluation and checkpoints work",
    "[batch_norm][parallel]") {
  ModelSpec m = test::model_from(
      "[model]\ninput_shape = [2, 6, 6]\n"
      "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\nuse_bias = "
      "false\n"
      "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n"
      "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
  const OptimizerSpec o = sgd();
  auto backend = test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 3\nthreads = 1"));
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<std::unique_ptr<Allocator>> allocs;
  for (int i = 0; i < 3; ++i) {
    devs.push_back(backend->open(i));
    AllocatorOptions ao;
    ao.limit = 128ull << 20;
    allocs.push_back(std::make_unique<Allocator>(*devs.back(), ao));
  }
  auto cfg = Config::load_string("[strategy]\ntype = \"data_parallel\"\n", "strategy.toml");
  auto table = cfg.root().table("strategy");
  auto dp = test::registry().strategy(table->get_string("type"))(*table);
  RunnerContext c;
  c.model = &m;
  c.optimizer = &o;
  c.devices = {{devs[0].get(), allocs[0].get()}, {devs[1].get(), allocs[1].get()}};
  c.global_batch = 8;
  c.seed = 11;
  auto r = dp->create(c);
  const Element batch = test::random_batch(8, m.input_shape, 3, 9);
  r->train_step(batch, {0, 0.05f});
  // Replica 0 ran rows 0..3 from the same initial weights: its running statistics are a single device's on them.
  Element first = batch;
  first.batch = 4;
  first.x = HostTensor(m.input_shape.with_batch(4));
  std::copy(batch.x.data.begin(), batch.x.data.begin() + long(first.x.data.size()), first.x.data.begin());
  first.y = HostTensor(Shape{4});
  std::copy(batch.y.data.begin(), batch.y.data.begin() + 4, first.y.data.begin());
  auto single = single_runner(m, o, *devs[2], *allocs[2], 4);
  single->train_step(first, {0, 0.05f});
  const auto want = single->save_state();
  auto got = r->save_state();  // replicas hold different running statistics: saved without a divergence error
  for (const char* name : {"bn.running_mean", "bn.running_var"}) {
    INFO(name);
    check_close(got.at(name).data, std::vector<double>(want.at(name).data.begin(), want.at(name).data.end()), 1e-6);
  }
  for (int s = 1; s < 4; ++s) r->train_step(batch, {s, 0.05f});
  EvalResult e = r->eval_batch(batch, false);
  REQUIRE(e.losses.size() == 1);
  CHECK(std::isfinite(e.losses[0]));
  // A fresh runner restored from the saved state evaluates the same (replica 0's statistics on both replicas).
  auto fresh = dp->create(c);
  fresh->load_state(r->save_state());
  CHECK(fresh->eval_batch(batch, false).losses[0] == Approx(r->eval_batch(batch, false).losses[0]).epsilon(1e-6));
}

TEST_CASE("a recomputed batch-norm layer updates its running statistics once per step", "[batch_norm][memory]") {
  auto backend = test::registry().backend("cpu")(BackendOptions::parse("threads = 1"));
  auto dev = backend->open(0);
  AllocatorOptions ao;
  ao.limit = 256ull << 20;
  Allocator alloc(*dev, ao);
  const OptimizerSpec o = sgd();
  std::map<std::string, std::vector<float>> got;
  for (bool recompute : {false, true}) {
    ModelSpec m = test::model_from(
        "[model]\ninput_shape = [2, 6, 6]\n"
        "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\n"
        "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n"
        "[[model.layers]]\nname = \"act\"\ntype = \"activation\"\nfunction = \"tanh\"\n"
        "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
        "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n");
    if (recompute) {
      m.savers.recompute = RecomputeMode::layers;
      m.savers.recompute_layers = {"bn", "act"};
    }
    auto r = single_runner(m, o, *dev, alloc, 8);
    const Element batch = test::random_batch(8, m.input_shape, 3, 4);
    for (int s = 0; s < 3; ++s) r->train_step(batch, {s, 0.05f});
    auto st = r->save_state();
    got[recompute ? "recompute" : "plain"] = st.at("bn.running_mean").data;
    got[recompute ? "recompute_var" : "plain_var"] = st.at("bn.running_var").data;
  }
  CHECK(got["plain"] == got["recompute"]);
  CHECK(got["plain_var"] == got["recompute_var"]);
}
