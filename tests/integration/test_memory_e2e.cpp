// Memory as a plan, end to end: kiln plan's prediction against a real training step's measured peak (the samples
// and the 206M-parameter deep net), refusal before allocating, the OOM report, --sweep, memory_policy = "fit". Also
// kiln plan on strategies that split a batch and on the parallel samples (where each layer runs, the bytes copied,
// each device's peak), and sizes no device holds named instead of printing FITS.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "kiln/config.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

const std::string kSamples = std::string(KILN_SOURCE_DIR) + "/samples/";

// Predicted and measured peak of one real training step at the config's batch size.
SweepPoint measure(const std::string& config, const std::vector<std::string>& overrides = {}) {
  Session s(Config::load_file(config, overrides), test::registry());
  if (auto train = s.make_pipeline("train")) s.model().label_shape = train->label_shape();
  s.open_devices(false);
  auto points = memory_sweep(s, {s.train().batch_size}, true, nullptr);
  return points.at(0);
}

bool found(const std::string& text, const std::string& re) { return std::regex_search(text, std::regex(re)); }

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string dense_model(const std::string& units, const std::string& input = "[784]") {
  return "[model]\ninput_shape = " + input + "\n[[model.layers]]\ntype = \"dense\"\nunits = " + units + "\n";
}

std::string small_run(const fs::path& out, const std::string& extra) {
  return "[run]\nname = \"oom\"\n[device]\nbackend = \"cpu\"\nmemory_limit = \"64MiB\"\n" + extra +
         "[model]\ninput_shape = [16]\nloss = \"softmax_cross_entropy\"\n"
         "[[model.layers]]\ntype = \"dense\"\nunits = 32\nactivation = \"relu\"\n[[model.layers]]\ntype = "
         "\"dense\"\nunits = 4\n"
         "[optimizer]\ntype = \"adam\"\n[train]\nepochs = 1\nbatch_size = 16\nevaluate = false\nprogress = \"none\"\n"
         "output_dir = \"" +
         out.string() +
         "\"\n"
         "[data.train]\nstages = [{ type = \"synthetic\", shape = [16], classes = 4, examples = 256, seed = 3 }, { "
         "type = \"batch\" }]\n";
}

}  // namespace

TEST_CASE("the measured peak of a real training step is within 5% of kiln plan for the samples", "[memory]") {
  for (std::string sample : {"fashion_mnist_mlp.toml", "fashion_mnist_cnn.toml", "fashion_mnist_ln_gelu.toml",
                             "resnet_fashion_mnist.toml"}) {
    for (std::string savers : {"", "inplace", "recompute"}) {
      std::vector<std::string> ov = {"device.memory_limit=\"1GiB\""};
      if (savers == "inplace") ov.push_back("memory.inplace=true");
      if (savers == "recompute") ov.push_back("memory.recompute=\"auto\"");
      SweepPoint p = measure(kSamples + sample, ov);
      INFO(sample << " " << savers << ": predicted " << p.predicted << ", measured " << p.measured);
      REQUIRE(p.fits);
      REQUIRE(p.measured > 0);
      CHECK(double(p.measured) <= 1.05 * double(p.predicted));
      CHECK(double(p.measured) >= 0.95 * double(p.predicted));
    }
  }
}

TEST_CASE("the 206M-parameter deep net fits 1800MiB with SGD and its measured step peak is within 5% of the plan",
          "[memory]") {
  SweepPoint p = measure(kSamples + "seed_deep_conv.toml");
  INFO("predicted " << p.predicted << ", measured " << p.measured);
  CHECK(p.fits);
  CHECK(p.limit == size_t(1800) << 20);
  CHECK(p.predicted > size_t(1650) * 1000 * 1000);  // weights + gradients alone are 1.65 GB
  CHECK(double(p.measured) <= 1.05 * double(p.predicted));
  CHECK(double(p.measured) >= 0.95 * double(p.predicted));
}

TEST_CASE("kiln plan and kiln train refuse the deep net with Adam before allocating, with the full report",
          "[memory]") {
  const std::string cfg = kSamples + "seed_deep_conv.toml --set optimizer.type=\\\"adam\\\"";
  auto plan = test::run_app("plan " + cfg);
  INFO(plan.output);
  CHECK(plan.exit_code == 1);
  CHECK_THAT(plan.output, Catch::Contains("206538153"));
  // Weights, gradients and Adam's two states: 4 x 826 MB = 3.3 GB, plus a few MB of activations and workspace.
  CHECK(found(plan.output, R"(DOES NOT FIT: needs 3\.\d\d GiB \(3\.3\d GB\))"));
  CHECK(found(plan.output, R"(limit\s+1\.76 GiB \(1\.89 GB\))"));
  CHECK_THAT(plan.output, Catch::Contains("largest batch size that fits: 0"));
  CHECK(found(plan.output, R"(type = "sgd" \(no state\) needs 1\.\d\d GiB \(1\.6\d GB\): fits)"));
  auto train =
      test::run_app("train " + cfg + " --set train.output_dir=\\\"" + test::temp_dir("deep-adam").string() + "\\\"");
  INFO(train.output);
  CHECK(train.exit_code == 1);
  CHECK(found(train.output, R"(3\.\d\d GiB)"));
  CHECK_THAT(train.output, Catch::Contains("nothing was allocated", Catch::CaseSensitive::No));
  CHECK_THAT(train.output, !Catch::Contains("epoch 1/1"));
  // The same report as kiln plan (needs Trainer::run to call enforce_memory_plan).
  CHECK_THAT(train.output, Catch::Contains("conv2d_24"));
  CHECK_THAT(train.output, Catch::Contains("what would fit"));
}

TEST_CASE("an out-of-memory failure names the site, advises what fits, and leaves checkpoint and metrics intact",
          "[memory]") {
  fs::path dir = test::temp_dir("mem-oom");
  fs::path cfg = dir / "run.toml";
  std::ofstream(cfg) << small_run(dir / "out", "");
  auto first = test::run_app("train " + cfg.string());
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // The last line says how long the run waited before its first step.
  CHECK(found(first.output, R"(done: \d+ steps in [\d.]+ s \(first step began \d+\.\d\d s after start\); metrics in)"));
  const std::string ckpt = read(dir / "out" / "checkpoint.kiln"), metrics = read(dir / "out" / "metrics.jsonl");
  REQUIRE(!ckpt.empty());
  // Resume for a second epoch on a device whose first block request fails.
  auto second = test::run_app(
      "train " + cfg.string() +
      " --resume --set train.epochs=2 --set device.fault_injection_block=1 --set train.memory_policy=\\\"none\\\"");
  INFO(second.output);
  CHECK(second.exit_code == 1);
  CHECK_THAT(second.output, Catch::Contains("out of memory on cpu:0"));
  CHECK_THAT(second.output, Catch::Contains("fault injection failed block request #1"));
  CHECK_THAT(second.output, Catch::Contains("allocating"));
  CHECK_THAT(second.output, Catch::Contains("limit 64.0 MiB"));
  CHECK_THAT(second.output, Catch::Contains("what would fit in the 64.0 MiB limit of cpu:0"));
  CHECK_THAT(second.output, Catch::Contains("batch size: the largest that fits is"));
  CHECK_THAT(second.output, Catch::Contains("type = \"sgd\" (no state) needs"));
  CHECK(read(dir / "out" / "checkpoint.kiln") == ckpt);
  CHECK(read(dir / "out" / "metrics.jsonl") == metrics);
}

TEST_CASE("kiln plan --sweep writes CSV and SVG with measured peaks within 5% of the predictions", "[memory]") {
  fs::path dir = test::temp_dir("mem-sweep");
  auto r = test::run_app("plan " + kSamples + "fashion_mnist_cnn.toml --sweep --sweep-out " + dir.string() +
                         " --set device.memory_limit=\\\"256MiB\\\" --set memory.sweep_batches=[1,16,128,100000]");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::ifstream csv(dir / "memory_sweep.csv");
  std::string line;
  std::getline(csv, line);
  CHECK(line == "batch,predicted_bytes,measured_bytes,limit_bytes,fits,step_seconds");
  int measured = 0, over = 0;
  while (std::getline(csv, line)) {
    std::stringstream ss(line);
    std::string batch, pred, meas, limit, fits;
    std::getline(ss, batch, ',');
    std::getline(ss, pred, ',');
    std::getline(ss, meas, ',');
    std::getline(ss, limit, ',');
    std::getline(ss, fits, ',');
    CHECK(limit == std::to_string(size_t(256) << 20));
    if (fits == "no") {
      ++over;
      CHECK(meas.empty());
      CHECK(std::stoull(pred) > std::stoull(limit));
      continue;
    }
    ++measured;
    double p = std::stod(pred), m = std::stod(meas);
    INFO("batch " << batch << " predicted " << p << " measured " << m);
    CHECK(m <= 1.05 * p);
    CHECK(m >= 0.95 * p);
  }
  CHECK(measured == 3);
  CHECK(over == 1);
  std::string svg = read(dir / "memory_sweep.svg");
  CHECK_THAT(svg, Catch::StartsWith("<svg"));
  CHECK_THAT(svg, Catch::Contains("predicted (kiln plan)"));
  CHECK_THAT(svg, Catch::Contains("limit 256.0 MiB"));
}

TEST_CASE("kiln plan finds the largest batch and sweeps for strategies that split a batch", "[hardening][plan]") {
  auto dir = kiln::test::temp_dir("hard-plan-dp");
  std::ofstream(dir / "run.toml")
      << "[device]\nbackend = \"cpu\"\nvirtual_devices = 2\nthreads = 1\nmemory_limit = \"64MiB\"\n"
      << "[strategy]\ntype = \"data_parallel\"\ndevices = [0, 1]\n"
      << "[model]\ninput_shape = [16]\n[[model.layers]]\ntype = \"dense\"\nunits = 4\n"
      << "[train]\nbatch_size = 8\noutput_dir = \"" << (dir / "out").string() << "\"\n"
      << "[data.train]\nstages = [{type = \"synthetic\", shape = [16], examples = 64}]\n";
  auto r = kiln::test::run_app("plan " + (dir / "run.toml").string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("largest batch size that fits: ") && !Catch::Contains("fits: 0"));
  r = kiln::test::run_app("plan " + (dir / "run.toml").string() + " --sweep --sweep-out " + (dir / "sweep").string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("batch 2: predicted") && !Catch::Contains("batch 1: predicted"));
}

TEST_CASE("kiln plan shows where each layer runs, the bytes copied and each device's peak for the samples",
          "[parallel]") {
  auto mp = test::run_app("plan " + std::string(KILN_SOURCE_DIR) + "/samples/two_branch_mp.toml");
  INFO(mp.output);
  CHECK(mp.exit_code == 0);
  CHECK_THAT(mp.output, Catch::Contains("step memory on cpu:1") &&
                            Catch::Contains("layer branch_a (dense): gemm, bias_add") &&
                            Catch::Contains("copies in per step: 96.0 KiB (encoder -> branch_a 64.0 KiB from cpu:0") &&
                            Catch::Contains("ideal bubble (K-1)/(M+K-1) = 0.500"));
  auto dp = test::run_app("plan " + std::string(KILN_SOURCE_DIR) + "/samples/fashion_mnist_dp.toml");
  INFO(dp.output);
  CHECK(dp.exit_code == 0);
  CHECK_THAT(dp.output,
             Catch::Contains("data_parallel replica 1 of 2: batch 16 of 32") && Catch::Contains("gradient all-reduce"));
}

TEST_CASE("kiln plan names [device] memory_limit = \"1e30GiB\" and huge units instead of printing FITS",
          "[hardening][sizes]") {
  auto dir = kiln::test::temp_dir("hard-sizes-plan");
  auto write = [&](const std::string& device, const std::string& units) {
    std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\n"
                                    << device << "\n"
                                    << dense_model(units) << "[train]\nbatch_size = 32\n";
    return (dir / "run.toml").string();
  };
  auto r = kiln::test::run_app("plan " + write("memory_limit = \"1e30GiB\"", "10"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("device.memory_limit") && Catch::Contains("16 EiB"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));

  r = kiln::test::run_app("plan " + write("", "4611686018427387904"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.layers[0].units"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));

  r = kiln::test::run_app("plan " + write("", "1099511627776"));  // 2^40 units: fits alone, not times 784 inputs
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.layers[0].units") && Catch::Contains("256 TiB"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));
}

TEST_CASE("memory_policy = \"fit\" turns on recomputation when the plan does not fit otherwise", "[memory]") {
  // A deep, wide MLP whose activations dominate at this batch: plain plan over the limit, recomputation under it.
  std::string layers;
  for (int i = 0; i < 16; ++i) layers += "[[model.layers]]\ntype = \"dense\"\nunits = 512\nactivation = \"relu\"\n";
  auto config = [&](const std::string& policy) {
    return "[device]\nbackend = \"cpu\"\nmemory_limit = \"56MiB\"\n[model]\ninput_shape = [64]\nloss = "
           "\"softmax_cross_entropy\"\n" +
           layers +
           "[[model.layers]]\ntype = \"dense\"\nunits = 4\n[optimizer]\ntype = \"sgd\"\n[train]\nbatch_size = "
           "1024\nmemory_policy = \"" +
           policy + "\"\n";
  };
  Session strict(Config::load_string(config("strict"), "fit.toml"), test::registry());
  strict.open_devices(false);
  std::ostringstream out;
  CHECK_THROWS_AS(enforce_memory_plan(strict, out), OutOfMemory);
  Session fit(Config::load_string(config("fit"), "fit.toml"), test::registry());
  fit.open_devices(false);
  REQUIRE_NOTHROW(enforce_memory_plan(fit, out));
  INFO(out.str());
  CHECK(fit.model().savers.recompute == RecomputeMode::auto_);
  CHECK(fit.model().savers.inplace);
  CHECK_THAT(out.str(), Catch::Contains("memory_policy = \"fit\""));
  PlanCheck c = check_plan(fit);
  CHECK(c.fits);  // the plan the runner will use (build_graph applies the savers) now fits
  // And a real step under those savers stays within the plan.
  auto points = memory_sweep(fit, {1024}, true, nullptr);
  CHECK(points[0].measured > 0);
  CHECK(points[0].measured <= points[0].limit);
  CHECK(double(points[0].measured) >= 0.95 * double(points[0].predicted));
}
