// The model_parallel strategy on logical CPU devices: a two-branch model split over three devices trains like the
// unsplit model (with and without pipeline micro-batches), the placement report, automatic placement, and errors.
#include <catch2/catch.hpp>

#include "kiln/error.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

// A shared encoder on cpu:0, two branches on cpu:1 and cpu:2, the merge (and the head) back on cpu:0.
const char* kTwoBranch = R"(
[model]
input_shape = [1, 6, 6]
[[model.layers]]
name = "flat"
type = "flatten"
[[model.layers]]
name = "enc"
type = "dense"
units = 12
activation = "tanh"
[[model.layers]]
name = "a"
type = "dense"
units = 8
activation = "tanh"
inputs = ["enc"]
device = "cpu:1"
[[model.layers]]
name = "b"
type = "dense"
units = 8
activation = "sigmoid"
inputs = ["enc"]
device = "cpu:2"
[[model.layers]]
name = "merge"
type = "concat"
inputs = ["a", "b"]
device = "cpu:0"
[[model.layers]]
name = "out"
type = "dense"
units = 3
)";

// A conv stack cut in the middle of a layer chain: the flatten view crosses a device boundary.
const char* kChain = R"(
[model]
input_shape = [2, 6, 6]
[[model.layers]]
type = "conv2d"
filters = 4
kernel = 3
padding = "same"
activation = "relu"
[[model.layers]]
type = "max_pool2d"
pool = 2
device = "1"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 10
activation = "tanh"
[[model.layers]]
type = "dense"
units = 3
device = "cpu:2"
)";

const char* kSgd = "[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nmomentum = 0.9\n";
const char* kAdam = "[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\nema = 0.9\n";

std::map<std::string, HostTensor> unsplit(const ModelSpec& m, const OptimizerSpec& o, int64_t batch, int steps,
                                          std::vector<float>* losses = nullptr) {
  CpuDevices one(1);
  auto r = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), batch));
  return train(*r, m, batch, steps, 3, losses);
}

const std::string kMp = "[strategy]\ntype = \"model_parallel\"\n";

}  // namespace

TEST_CASE("model_parallel of a two-branch model over three devices gives exactly the unsplit model's weights",
          "[parallel]") {
  for (const char* model : {kTwoBranch, kChain}) {
    ModelSpec m = model_from(model);
    for (const char* opt : {kSgd, kAdam}) {
      CAPTURE(model, opt);
      OptimizerSpec o = optimizer_from(opt);
      std::vector<float> ref_losses, losses;
      auto ref = unsplit(m, o, 8, 4, &ref_losses);
      for (const char* extra : {"", "concurrent = false\n"}) {
        CpuDevices devs(3);
        auto r = strategy(kMp + extra)->create(context(m, o, devs.ctx(), 8));
        losses.clear();
        auto got = train(*r, m, 8, 4, 3, &losses);
        // The same ops on the same data in the same order, only on other devices: bit-identical.
        CHECK(max_abs_diff(got, ref) == 0.0);
        CHECK(losses == ref_losses);
        for (size_t d = 1; d < 3; ++d) CHECK(devs.allocs[d]->stats().in_use_by_tag[size_t(MemoryTag::parameters)] > 0);
      }
    }
  }
}

TEST_CASE("model_parallel with pipeline micro-batches matches the unsplit model within float tolerance", "[parallel]") {
  ModelSpec m = model_from(kTwoBranch);
  for (const char* opt : {kSgd, kAdam}) {
    OptimizerSpec o = optimizer_from(opt);
    std::vector<float> ref_losses;
    auto ref = unsplit(m, o, 8, 4, &ref_losses);
    for (int micro : {2, 4}) {
      for (const char* extra : {"", "concurrent = false\n"}) {
        CAPTURE(opt, micro, extra);
        CpuDevices devs(3);
        auto r = strategy(kMp + "micro_batches = " + std::to_string(micro) + "\n" + extra)
                     ->create(context(m, o, devs.ctx(), 8));
        std::vector<float> losses;
        // Micro-batch gradients are summed with share weights (exact powers of two here); only the order of the
        // batch sums differs from one device. Adam divides by sqrt(v), which magnifies the rounding of small
        // gradients: measured 1e-6 (M=2) and 4e-6 (M=4) after 4 steps, against 1e-7 for SGD.
        const double tol = opt == kSgd ? 1e-6 : 1e-5;
        CHECK(max_abs_diff(train(*r, m, 8, 4, 3, &losses), ref) < tol);
        for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == Approx(ref_losses[i]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("model_parallel evaluation and checkpoints work across the devices", "[parallel]") {
  ModelSpec m = model_from(kTwoBranch);
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices one(1), devs(3), again(3);
  auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 8));
  auto mp = strategy(kMp + "micro_batches = 2\n")->create(context(m, o, devs.ctx(), 8));
  train(*single, m, 8, 2, 3);
  train(*mp, m, 8, 2, 3);
  auto b = random_batch(8, m.input_shape, 3, 77);
  for (bool ema : {false, true}) {
    auto x = single->eval_batch(b, ema), y = mp->eval_batch(b, ema);
    CHECK(y.losses[0] == Approx(x.losses[0]).epsilon(1e-5));
    REQUIRE(y.outputs[0].shape == x.outputs[0].shape);
    for (size_t i = 0; i < x.outputs[0].data.size(); ++i)
      CHECK(y.outputs[0].data[i] == Approx(x.outputs[0].data[i]).margin(1e-5));
  }
  auto saved = mp->save_state();
  CHECK(saved.count("a.kernel/adam_m") == 1);  // state of every device is gathered
  CHECK(saved.count("b.bias/ema") == 1);
  auto restored = strategy(kMp + "micro_batches = 2\n")->create(context(m, o, again.ctx(), 8));
  restored->load_state(saved);
  auto next = random_batch(8, m.input_shape, 3, 78);
  mp->train_step(next, {2, 0.01f});
  restored->train_step(next, {2, 0.01f});
  CHECK(max_abs_diff(mp->save_state(), restored->save_state()) == 0.0);
}

TEST_CASE("the model_parallel placement report names each layer's device, its ops and the bytes copied", "[parallel]") {
  ModelSpec m = model_from(kTwoBranch);
  OptimizerSpec o = optimizer_from(kSgd);
  CpuDevices devs(3);
  auto plans = strategy(kMp)->plan(context(m, o, devs.ctx(), 8));
  REQUIRE(plans.size() == 3);
  auto notes = [&](size_t s) {
    std::string all;
    for (const auto& n : plans[s].notes) all += n + "\n";
    return all;
  };
  CHECK(plans[1].device == "cpu:1");
  CHECK_THAT(notes(0), Catch::Contains("layer enc (dense): gemm, bias_add, activation_forward") &&
                           Catch::Contains("layer merge (concat): concat") && Catch::Contains("layer out (dense)"));
  CHECK_THAT(notes(1), Catch::Contains("layer a (dense)") && !Catch::Contains("layer b "));
  // Batch 8: enc's output (8x12 floats) goes to both branches and its gradient comes back; each branch output
  // (8x8) goes to cpu:0 and its gradient comes back.
  CHECK_THAT(notes(1), Catch::Contains("copies in per step: 640 B") && Catch::Contains("copies out per step: 640 B"));
  CHECK_THAT(notes(0), Catch::Contains("copies in per step: 1280 B") && Catch::Contains("enc -> a 384 B to cpu:1"));
  auto piped = strategy(kMp + "micro_batches = 2\n")->plan(context(m, o, devs.ctx(), 8));
  std::string all;
  for (const auto& n : piped[0].notes) all += n + "\n";
  // Three stages (encoder, branches, merge) and two micro-batches: (3-1)/(2+3-1).
  CHECK_THAT(all, Catch::Contains("2 micro-batches of 4 rows over 3 stage(s); ideal bubble (K-1)/(M+K-1) = 0.500"));
  CHECK(piped[1].gradients == 2 * plans[1].gradients);  // each micro-batch in flight has its own gradients
  CHECK(piped[1].parameters == plans[1].parameters);    // the weights are not duplicated
}

TEST_CASE("placement = auto splits the layers so every device's planned peak fits its limit", "[parallel]") {
  ModelSpec m = model_from(R"(
[model]
input_shape = [64]
[[model.layers]]
type = "dense"
units = 96
activation = "relu"
[[model.layers]]
type = "dense"
units = 96
activation = "relu"
[[model.layers]]
type = "dense"
units = 96
activation = "relu"
[[model.layers]]
type = "dense"
units = 3
)");
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices big(1);
  auto whole = strategy(kMp)->plan(context(m, o, big.ctx(), 8))[0].total();
  const size_t limit = whole * 6 / 10;  // the model needs two of these devices, and fits on three
  CpuDevices devs(3, limit);
  auto ctx = context(m, o, devs.ctx(), 8);
  CHECK_THROWS_WITH(strategy(kMp)->create(ctx),
                    Catch::Contains("does not fit") && Catch::Contains("cpu:0: planned peak"));
  auto s = strategy(kMp + "placement = \"auto\"\n");
  auto plans = s->plan(ctx);
  int used = 0;
  for (const auto& p : plans) {
    CHECK(p.total() <= limit);
    used += p.parameters > 0;
  }
  CHECK(used >= 2);
  auto r = s->create(ctx);
  CHECK(max_abs_diff(train(*r, m, 8, 3, 3), unsplit(m, o, 8, 3)) == 0.0);
  CpuDevices tiny(3, whole / 4);
  CHECK_THROWS_WITH(s->plan(context(m, o, tiny.ctx(), 8)), Catch::Contains("placement = \"auto\" found no split"));
}

TEST_CASE("model_parallel configuration errors come before any step", "[parallel]") {
  OptimizerSpec o = optimizer_from(kSgd);
  CpuDevices devs(3);
  ModelSpec m = model_from(kTwoBranch);
  // The branches name cpu:1 and cpu:2, but the strategy only has cpu:0 and cpu:1.
  CHECK_THROWS_WITH(strategy(kMp + "devices = [0, 1]\n")->create(context(m, o, devs.ctx(), 8)),
                    Catch::Contains("layer 'b' has device = \"cpu:2\"") && Catch::Contains("not one of"));
  CHECK_THROWS_WITH(strategy(kMp + "micro_batches = 3\n")->create(context(m, o, devs.ctx(), 8)),
                    Catch::Contains("micro_batches = 3"));
  CHECK_THROWS_WITH(strategy(kMp + "micro_batches = 0\n"), Catch::Contains("micro_batches"));
  CHECK_THROWS_WITH(strategy(kMp + "placement = \"auto\"\n")->create(context(m, o, devs.ctx(), 8)),
                    Catch::Contains("placement = \"auto\", but layer 'a' sets device"));
  CHECK_THROWS_WITH(strategy(kMp + "placement = \"greedy\"\n"), Catch::Contains("placement"));
  CHECK_THROWS_WITH(strategy(kMp + "devices = [2, 2]\n"), Catch::Contains("listed twice"));
  for (auto& a : devs.allocs) CHECK(a->stats().in_use == 0);
}

TEST_CASE("a device that fails mid-step stops every model-parallel device with one error", "[parallel]") {
  ModelSpec m = model_from(kTwoBranch);
  OptimizerSpec o = optimizer_from(kSgd);
  for (const char* extra : {"", "concurrent = false\n"})
    for (int fail_in : {2, 9}) {
      CAPTURE(extra, fail_in);
      CpuDevices devs(3);
      FailingDevice* failing = wrap_failing(devs, 1);
      auto r = strategy(kMp + "micro_batches = 2\n" + extra)->create(context(m, o, devs.ctx(), 8));
      auto b = random_batch(8, m.input_shape, 3, 1);
      r->train_step(b, {0, 0.01f});
      failing->fail_after(fail_in);
      try {
        r->train_step(b, {1, 0.01f});
        FAIL("expected a DeviceError");
      } catch (const DeviceError& e) {
        CHECK_THAT(e.what(),
                   Catch::Contains("device cpu:1 (slot 1) failed") && Catch::Contains("injected launch failure"));
      }
    }
}
