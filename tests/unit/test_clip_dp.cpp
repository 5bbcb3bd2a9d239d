// clip_norm under data_parallel: the replicas clip the all-reduced gradient, so training matches one device (as
// DDP followed by clip_grad_norm_ does); sharded optimizer state refuses it.
#include <catch2/catch.hpp>

#include "kiln/error.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

const char* kMlp = R"(
[model]
input_shape = [6]
[[model.layers]]
type = "dense"
units = 8
activation = "tanh"
[[model.layers]]
type = "dense"
units = 3
)";

}  // namespace

TEST_CASE("data_parallel clips the all-reduced gradient: the weights and norms of one device",
          "[clip_norm][parallel]") {
  ModelSpec m = model_from(kMlp);
  // A max norm below the gradients' norm (measured ~0.5 to 1 here), so every step clips.
  OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.5\nclip_norm = 0.05\n");
  std::vector<float> ref_norms, norms;
  CpuDevices one(1);
  auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 16));
  for (int s = 0; s < 4; ++s)
    ref_norms.push_back(single->train_step(random_batch(16, m.input_shape, 3, 100u + s), {s, 0.5f}).grad_norm);
  const auto ref = single->save_state();
  // One bucket, and a bucket per gradient (reduced while backward runs): the clip waits for every reduction.
  for (const char* bucket : {"1MiB", "16"}) {
    CAPTURE(bucket);
    CpuDevices two(2);
    auto dp = strategy(std::string("[strategy]\ntype = \"data_parallel\"\nbucket_size = \"") + bucket + "\"\n")
                  ->create(context(m, o, two.ctx(), 16));
    norms.clear();
    for (int s = 0; s < 4; ++s)
      norms.push_back(dp->train_step(random_batch(16, m.input_shape, 3, 100u + s), {s, 0.5f}).grad_norm);
    CHECK(max_abs_diff(dp->save_state(), ref) < 1e-6);
    for (size_t i = 0; i < norms.size(); ++i) {
      CHECK(ref_norms[i] > 0.05f);  // clipping was active
      CHECK(norms[i] == Approx(ref_norms[i]).epsilon(1e-5));
    }
  }
  // Without clipping the result differs: the test would notice clipping that did nothing.
  OptimizerSpec plain = optimizer_from("[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.5\n");
  CpuDevices one_more(1);
  auto unclipped = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, plain, one_more.ctx(), 16));
  for (int s = 0; s < 4; ++s)
    CHECK(unclipped->train_step(random_batch(16, m.input_shape, 3, 100u + s), {s, 0.5f}).grad_norm == -1.f);
  CHECK(max_abs_diff(unclipped->save_state(), ref) > 1e-3);

  CpuDevices two_more(2);
  auto sharded = strategy("[strategy]\ntype = \"data_parallel\"\noptimizer_state = \"sharded\"\n");
  CHECK_THROWS_WITH(sharded->create(context(m, o, two_more.ctx(), 16)),
                    Catch::Contains("sharded") && Catch::Contains("clip_norm"));
}

TEST_CASE("clip_norm is refused when the parameters live on several devices (model_parallel)",
          "[clip_norm][parallel]") {
  ModelSpec m = model_from(kMlp);
  OptimizerSpec o = optimizer_from("[optimizer]\ntype = \"sgd\"\nclip_norm = 1.0\n");
  GraphOptions go;
  go.batch = 4;
  go.optimizer = &o;
  int next = 0;
  go.place = [&](const LayerSpec&) { return next++; };  // one layer per device
  CHECK_THROWS_WITH(build_graph(m, go), Catch::Contains("clip_norm") && Catch::Contains("model_parallel"));
  next = 0;
  go.place = [](const LayerSpec&) { return 1; };  // everything on one device: clipped there
  const Graph g = build_graph(m, go);
  REQUIRE(g.grad_sq != kNoTensor);
  CHECK(g.tensor(g.grad_sq).device == 1);
}
