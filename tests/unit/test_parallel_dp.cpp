// The data_parallel strategy on logical CPU devices: equivalence with one device, uneven splits, sharded
// optimizer state, checkpoints, evaluation, and the errors it must give before (or during) a step.
#include <catch2/catch.hpp>

#include "kiln/error.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

const char* kConvNet = R"(
[model]
input_shape = [1, 6, 6]
[[model.layers]]
type = "conv2d"
filters = 4
kernel = 3
padding = "same"
activation = "tanh"
[[model.layers]]
type = "max_pool2d"
pool = 2
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 8
activation = "tanh"
[[model.layers]]
type = "dense"
units = 3
)";

const char* kSgd = "[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nmomentum = 0.9\n";
const char* kAdam = "[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\nema = 0.9\n";

// The float tolerance of data-parallel against one device: only the order of the batch sums differs, so the
// weights agree to within 1e-6 (measured: 6e-8 to 2e-7) after a handful of steps.
constexpr double kTol = 1e-6;

}  // namespace

TEST_CASE("data_parallel on 2 and 4 CPU devices gives the weights of one device on the same global batch",
          "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  for (const char* opt : {kSgd, kAdam}) {
    OptimizerSpec o = optimizer_from(opt);
    std::vector<float> ref_losses;
    auto ref = single_device(m, o, 16, 5, &ref_losses);
    for (int n : {2, 4}) {
      CAPTURE(opt, n);
      CpuDevices devs(n);
      auto s = strategy("[strategy]\ntype = \"data_parallel\"\nbucket_size = 600\n");
      auto r = s->create(context(m, o, devs.ctx(), 16));
      std::vector<float> losses;
      auto got = train(*r, m, 16, 5, 3, &losses);
      REQUIRE(got.size() == ref.size());  // parameters, optimizer state and EMA, all present
      CHECK(max_abs_diff(got, ref) < kTol);
      for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == Approx(ref_losses[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("data_parallel results do not depend on overlap, bucket size or running replicas one after another",
          "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices devs(3);
  auto base =
      strategy("[strategy]\ntype = \"data_parallel\"\nbucket_size = 64\n")->create(context(m, o, devs.ctx(0, 3), 12));
  auto ref = train(*base, m, 12, 3, 3);
  for (const char* variant : {"overlap = false\n", "concurrent = false\n", "bucket_size = \"64MiB\"\n"}) {
    CAPTURE(variant);
    CpuDevices fresh(3);
    auto r = strategy(std::string("[strategy]\ntype = \"data_parallel\"\n") + variant)
                 ->create(context(m, o, fresh.ctx(), 12));
    CHECK(max_abs_diff(train(*r, m, 12, 3, 3), ref) == 0.0);  // same sums in the same order: bit-identical
  }
}

TEST_CASE("data_parallel with one replica is exactly the single-device run", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  auto ref = single_device(m, o, 8, 3);
  for (const char* extra : {"", "optimizer_state = \"sharded\"\n", "concurrent = false\n"}) {
    CAPTURE(extra);
    CpuDevices one(1);
    auto r =
        strategy(std::string("[strategy]\ntype = \"data_parallel\"\n") + extra)->create(context(m, o, one.ctx(), 8));
    CHECK(max_abs_diff(train(*r, m, 8, 3, 3), ref) == 0.0);
  }
}

TEST_CASE("data_parallel with uneven = true weights each replica's gradient by its share of the batch", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kSgd);
  auto ref = single_device(m, o, 10, 4);
  CpuDevices devs(4);
  auto r = strategy("[strategy]\ntype = \"data_parallel\"\nuneven = true\n")->create(context(m, o, devs.ctx(), 10));
  auto plans = r->plan();
  REQUIRE(plans.size() == 4);
  CHECK(plans[0].notes[0].find("batch 3 of 10") != std::string::npos);
  CHECK(plans[3].notes[0].find("batch 2 of 10") != std::string::npos);
  CHECK(max_abs_diff(train(*r, m, 10, 4, 3), ref) < kTol);
}

TEST_CASE("data_parallel refuses a global batch that does not split evenly unless uneven = true", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kSgd);
  CpuDevices devs(4);
  auto s = strategy("[strategy]\ntype = \"data_parallel\"\n");
  auto ctx = context(m, o, devs.ctx(), 10);
  CHECK_THROWS_AS(s->plan(ctx), ConfigError);
  try {
    s->create(ctx);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("batch_size = 10 does not split evenly over 4 replicas") &&
                             Catch::Contains("uneven = true") && Catch::Contains("strategy.toml"));
  }
  CHECK(devs.allocs[0]->stats().in_use == 0);  // refused before anything was allocated
}

TEST_CASE("data_parallel splits a smaller final batch, even one with fewer rows than replicas", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kSgd);
  CpuDevices one(1), devs(4);
  auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 8));
  auto dp = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(m, o, devs.ctx(), 8));
  int step = 0;
  for (int64_t rows : {8, 6, 3, 1}) {  // 6 -> 2,2,1,1; 3 -> 1,1,1,0; 1 -> 1,0,0,0
    auto b = random_batch(rows, m.input_shape, 3, 7u + uint32_t(rows));
    auto a = single->train_step(b, {step, 0.05f});
    auto c = dp->train_step(b, {step, 0.05f});
    CHECK(c.total_loss == Approx(a.total_loss).epsilon(1e-5));
    ++step;
  }
  CHECK(max_abs_diff(dp->save_state(), single->save_state()) < kTol);
}

TEST_CASE("data_parallel evaluation splits the batch and returns what one device returns", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices one(1), devs(2);
  auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 8));
  auto dp = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(m, o, devs.ctx(), 8));
  train(*single, m, 8, 2, 3);
  train(*dp, m, 8, 2, 3);
  auto b = random_batch(7, m.input_shape, 3, 99);
  for (bool ema : {false, true}) {
    auto a = single->eval_batch(b, ema), c = dp->eval_batch(b, ema);
    REQUIRE(c.outputs.size() == 1);
    REQUIRE(c.outputs[0].shape == a.outputs[0].shape);
    CHECK(c.losses[0] == Approx(a.losses[0]).epsilon(1e-4));
    for (size_t i = 0; i < a.outputs[0].data.size(); ++i)
      CHECK(c.outputs[0].data[i] == Approx(a.outputs[0].data[i]).margin(1e-4));
  }
}

TEST_CASE("sharded optimizer state trains like replicated state and splits its memory over the replicas",
          "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  auto ref = single_device(m, o, 16, 4);
  for (int n : {2, 4}) {
    CAPTURE(n);
    CpuDevices devs(n);
    auto ctx = context(m, o, devs.ctx(), 16);
    auto rep_plan = strategy("[strategy]\ntype = \"data_parallel\"\n")->plan(ctx);
    auto s = strategy("[strategy]\ntype = \"data_parallel\"\noptimizer_state = \"sharded\"\nbucket_size = 256\n");
    auto shard_plan = s->plan(ctx);
    size_t sharded = 0;
    const size_t replicated = rep_plan[0].optimizer_state;  // every replica keeps all of it
    for (size_t r = 0; r < size_t(n); ++r) {
      sharded += shard_plan[r].optimizer_state;
      CHECK(shard_plan[r].optimizer_state < replicated);
      CHECK(shard_plan[r].parameters == rep_plan[r].parameters);
      CHECK_THAT(shard_plan[r].notes[2], Catch::Contains("ZeRO stage 1"));
    }
    // Split by elements: together the shards hold one copy of the state, plus the alignment of the cut slices.
    CHECK(sharded >= replicated / 2);
    CHECK(sharded <= replicated + size_t(n) * 2 * 256);
    auto r = s->create(ctx);
    for (size_t d = 0; d < size_t(n); ++d)
      CHECK(devs.allocs[d]->stats().in_use_by_tag[size_t(MemoryTag::optimizer_state)] == shard_plan[d].optimizer_state);
    auto got = train(*r, m, 16, 4, 3);  // save_state gathers every shard
    CHECK(got.count("dense_1.kernel/adam_m") == 1);
    CHECK(max_abs_diff(got, ref) < kTol);
  }
}

TEST_CASE("sharding splits one large parameter's optimizer state evenly by elements", "[parallel]") {
  ModelSpec m = model_from(R"(
[model]
input_shape = [300]
[[model.layers]]
type = "dense"
units = 64
[[model.layers]]
type = "dense"
units = 3
)");
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices devs(4);
  auto plans = strategy("[strategy]\ntype = \"data_parallel\"\noptimizer_state = \"sharded\"\n")
                   ->plan(context(m, o, devs.ctx(), 8));
  // 300x64 + 64 + 64x3 + 3 = 19459 weights; Adam keeps 2 floats each: about 38.9 KB per replica, not all on one.
  for (const auto& p : plans) {
    CHECK(p.optimizer_state >= 2 * 4 * (19459 / 4 - 64));
    CHECK(p.optimizer_state <= 2 * 4 * (19459 / 4 + 64) + 2 * 3 * 256);
  }
}

TEST_CASE("a data_parallel checkpoint restores into a fresh runner and training continues identically", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  const char* cfg = "[strategy]\ntype = \"data_parallel\"\noptimizer_state = \"sharded\"\n";
  CpuDevices a(2), b(2);
  auto first = strategy(cfg)->create(context(m, o, a.ctx(), 8));
  train(*first, m, 8, 2, 3);
  auto saved = first->save_state();
  auto batch = random_batch(8, m.input_shape, 3, 5);
  first->train_step(batch, {2, 0.05f});
  auto second = strategy(cfg)->create(context(m, o, b.ctx(), 8));
  second->load_state(saved);
  second->train_step(batch, {2, 0.05f});
  CHECK(max_abs_diff(first->save_state(), second->save_state()) == 0.0);
  saved["no_such_layer.kernel"] = HostTensor(Shape{1});
  CHECK_THROWS_WITH(second->load_state(saved), Catch::Contains("no_such_layer.kernel"));
}

TEST_CASE("data_parallel device lists: a device listed twice or not opened is a config error before any step",
          "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kSgd);
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [0, 1, 0]\n"),
                    Catch::Contains("strategy.devices") && Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:1\", \"cpu:1\"]\n"),
                    Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [0, \"cpu:1\"]\n"),
                    Catch::Contains("not a mix"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\nbucket_size = 0\n"),
                    Catch::Contains("bucket_size"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\nreplicas = 2\n"), Catch::Contains("replicas"));
  CpuDevices devs(2);
  auto ctx = context(m, o, devs.ctx(), 8);
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"1\", \"cpu:1\"]\n")->create(ctx),
                    Catch::Contains("names cpu:1 twice"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:1\", \"cpu:5\"]\n")->create(ctx),
                    Catch::Contains("cpu:5") && Catch::Contains("not among the opened devices: 0 = cpu:0, 1 = cpu:1"));
  CHECK_THROWS_WITH(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [\"cpu:0\", \"tpu:0\"]\n")->create(ctx),
                    Catch::Contains("\"tpu:0\"") && Catch::Contains("no backend \"tpu\" is loaded"));
  CHECK_THROWS_AS(strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [0, 2]\n")->plan(ctx), ConfigError);
  auto s = strategy("[strategy]\ntype = \"data_parallel\"\ndevices = [0, 3]\n");
  CHECK(s->device_count(8) == 4);
  CHECK(strategy("[strategy]\ntype = \"data_parallel\"\n")->device_count(3) == 3);
  CHECK(devs.allocs[0]->stats().in_use == 0);
}

TEST_CASE("data_parallel refuses a replica whose plan exceeds its device's limit before allocating", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  CpuDevices devs(2, 4096);
  try {
    strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(m, o, devs.ctx(), 8));
    FAIL("expected OutOfMemory");
  } catch (const OutOfMemory& e) {
    CHECK_THAT(e.what(), Catch::Contains("replica 0") && Catch::Contains("Nothing was allocated"));
  }
  CHECK(devs.allocs[0]->stats().in_use == 0);
}

TEST_CASE("a device that fails mid-step stops every replica with one error naming it", "[parallel]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  for (const char* extra : {"", "concurrent = false\n"})
    for (int fail_in : {3, 14, 30}) {  // forward, backward (while buckets are being reduced), update
      CAPTURE(extra, fail_in);
      CpuDevices devs(4);
      FailingDevice* failing = wrap_failing(devs, 2);
      auto r = strategy(std::string("[strategy]\ntype = \"data_parallel\"\nbucket_size = 128\n") + extra)
                   ->create(context(m, o, devs.ctx(), 16));
      auto b = random_batch(16, m.input_shape, 3, 1);
      r->train_step(b, {0, 0.01f});
      failing->fail_after(fail_in);
      try {
        r->train_step(b, {1, 0.01f});
        FAIL("expected a DeviceError");
      } catch (const DeviceError& e) {
        CHECK_THAT(e.what(), Catch::Contains("replica 2 (cpu:2)") && Catch::Contains("failed") &&
                                 Catch::Contains("injected launch failure"));
      }
    }
}

TEST_CASE("data_parallel with prefetched batches gives exactly the weights of copying each batch in the step",
          "[parallel][prefetch]") {
  ModelSpec m = model_from(kConvNet);
  OptimizerSpec o = optimizer_from(kAdam);
  std::vector<Element> batches;
  for (uint32_t k = 0; k < 5; ++k) batches.push_back(random_batch(12, m.input_shape, 3, 300 + k));
  batches.push_back(random_batch(7, m.input_shape, 3, 400));  // a smaller last batch: 3 + 2 + 2 rows on 3 replicas
  for (int n : {1, 3}) {
    CAPTURE(n);
    auto run = [&](int slots, bool prefetch, std::vector<float>& losses) {
      CpuDevices devs(n);
      RunnerContext ctx = context(m, o, devs.ctx(), 12);
      ctx.input_slots = slots;
      auto r = strategy("[strategy]\ntype = \"data_parallel\"\nbucket_size = 600\n")->create(ctx);
      for (size_t k = 0; k < batches.size(); ++k) {
        if (prefetch && k + 1 < batches.size() && k != 1)
          r->prefetch(batches[k + 1]);  // step 2's batch is copied in the step
        losses.push_back(r->train_step(batches[k], {int64_t(k), 0.05f}).total_loss);
      }
      auto st = r->save_state();
      if (prefetch) r->prefetch(batches[0]);  // left in flight: the runner waits for it when destroyed
      return st;
    };
    std::vector<float> plain_losses, pf_losses;
    auto plain = run(1, false, plain_losses);
    auto pf = run(2, true, pf_losses);
    CHECK(plain_losses == pf_losses);
    CHECK(max_abs_diff(plain, pf) == 0.0);
  }
}
