// batch_norm with sync = true (PyTorch's SyncBatchNorm) under data_parallel: the statistics and the input gradient
// are taken over the global batch, so replicas train exactly as one device on the whole batch, where plain batch
// norm (each replica its own rows, as PyTorch DDP) does not.
#include <catch2/catch.hpp>

#include "kiln/error.hpp"
#include "test_parallel_support.hpp"

using namespace kiln;
using namespace kiln::test::par;

namespace {

// Two synchronized batch norms: BatchNorm2d after the convolution and (with_1d) BatchNorm1d after the first dense
// layer. Neither layer before a batch norm has a bias: its gradient is zero up to rounding, which Adam would turn
// into full-size steps of the rounding's sign, different on every summation order.
std::string conv_bn_net(bool sync, bool with_1d = true) {
  const std::string s = sync ? "sync = true\n" : "";
  return "[model]\ninput_shape = [2, 6, 6]\n"
         "[[model.layers]]\nname = \"conv\"\ntype = \"conv2d\"\nfilters = 4\nkernel = 3\npadding = \"same\"\nuse_bias "
         "= false\n"
         "[[model.layers]]\nname = \"bn\"\ntype = \"batch_norm\"\n" +
         s +
         "[[model.layers]]\nname = \"act\"\ntype = \"activation\"\nfunction = \"tanh\"\n"
         "[[model.layers]]\nname = \"pool\"\ntype = \"max_pool2d\"\npool = 2\n"
         "[[model.layers]]\nname = \"flat\"\ntype = \"flatten\"\n"
         "[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 8\nuse_bias = false\n" +
         (with_1d ? "[[model.layers]]\nname = \"bn1d\"\ntype = \"batch_norm\"\nmomentum = 0.3\n" + s : std::string()) +
         "[[model.layers]]\nname = \"act2\"\ntype = \"activation\"\nfunction = \"tanh\"\n"
         "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 3\n";
}

const char* kSgd = "[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\nmomentum = 0.9\n";
const char* kAdam = "[optimizer]\ntype = \"adam\"\nlearning_rate = 0.01\nema = 0.9\n";

// Data-parallel sums in another order than one device, and the synchronized statistics are summed in double on
// the host where the CPU kernel sums in float: weights and running statistics agree to a few 1e-7 after a handful
// of steps (measured at most 4.5e-7), while per-replica statistics end more than 1e-3 away (checked below).
constexpr double kTol = 5e-6;

}  // namespace

TEST_CASE(
    "batch_norm sync = true: data_parallel on 2 and 4 devices trains as one device on the global batch, where "
    "per-replica statistics do not",
    "[batch_norm][parallel][sync_bn]") {
  const ModelSpec m = model_from(conv_bn_net(true));
  for (const char* opt : {kSgd, kAdam}) {
    const OptimizerSpec o = optimizer_from(opt);
    std::vector<float> ref_losses;
    const auto ref = single_device(m, o, 16, 4, &ref_losses);
    for (int n : {2, 4}) {
      for (const char* extra : {"", "concurrent = false\nbucket_size = 300\n"}) {
        CAPTURE(opt, n, extra);
        CpuDevices devs(n);
        auto r = strategy(std::string("[strategy]\ntype = \"data_parallel\"\n") + extra)
                     ->create(context(m, o, devs.ctx(), 16));
        std::vector<float> losses;
        const auto got = train(*r, m, 16, 4, 3, &losses);
        REQUIRE(got.size() == ref.size());  // parameters, running statistics, optimizer state and EMA
        CHECK(max_abs_diff(got, ref) < kTol);
        REQUIRE(losses.size() == ref_losses.size());
        for (size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == Approx(ref_losses[i]).epsilon(1e-5));
        // Evaluation reads the running statistics, which every replica holds identically.
        const auto b = random_batch(16, m.input_shape, 3, 7);
        CpuDevices one(1);
        auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 16));
        single->load_state(ref);
        CHECK(r->eval_batch(b, false).losses[0] == Approx(single->eval_batch(b, false).losses[0]).epsilon(1e-5));
      }
    }
    // The same model without sync: each replica's own statistics, not the single device's.
    const ModelSpec plain = model_from(conv_bn_net(false));
    CpuDevices devs(2);
    auto r = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(plain, o, devs.ctx(), 16));
    const auto got = train(*r, plain, 16, 4, 3);
    CHECK(max_abs_diff(got, single_device(plain, o, 16, 4)) > 1e-3);
  }
}

TEST_CASE("batch_norm sync = true with uneven shares, with a replica left without rows, and recomputed in backward",
          "[batch_norm][parallel][sync_bn]") {
  const OptimizerSpec o = optimizer_from(kSgd);
  SECTION("10 rows over 4 replicas (3, 3, 2, 2) match one device on the 10") {
    const ModelSpec m = model_from(conv_bn_net(true));
    const auto ref = single_device(m, o, 10, 4);
    CpuDevices devs(4);
    auto r = strategy("[strategy]\ntype = \"data_parallel\"\nuneven = true\n")->create(context(m, o, devs.ctx(), 10));
    CHECK(max_abs_diff(train(*r, m, 10, 4, 3), ref) < kTol);
  }
  SECTION("a last batch of 3 rows over 4 replicas: the replica without rows keeps the same running statistics") {
    const ModelSpec m = model_from(conv_bn_net(true, false));  // BatchNorm1d would see one row per replica
    CpuDevices one(1), devs(4);
    auto single = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), 8));
    auto r = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(m, o, devs.ctx(), 8));
    for (int64_t rows : {8, 3, 8}) {
      const auto b = random_batch(rows, m.input_shape, 3, 40u + uint32_t(rows));
      CHECK(r->train_step(b, {0, 0.05f}).total_loss ==
            Approx(single->train_step(b, {0, 0.05f}).total_loss).epsilon(1e-5));
    }
    // save_state refuses replicas whose tensors differ: it succeeding is the check that all four agree.
    CHECK(max_abs_diff(r->save_state(), single->save_state()) < kTol);
  }
  SECTION("recomputing the batch norms in backward computes the global statistics again") {
    ModelSpec m = model_from(conv_bn_net(true));
    m.savers.recompute = RecomputeMode::layers;
    m.savers.recompute_layers = {"bn", "act", "bn1d"};
    const auto ref = single_device(m, o, 12, 3);
    CpuDevices devs(3);
    auto r = strategy("[strategy]\ntype = \"data_parallel\"\n")->create(context(m, o, devs.ctx(), 12));
    CHECK(max_abs_diff(train(*r, m, 12, 3, 3), ref) < kTol);
  }
}
