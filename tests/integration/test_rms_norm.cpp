// rms_norm (core/ops/rms_norm.cpp): its semantics, a model with the layer trains on cpu and vulkan alike, and the
// ONNX exporter refuses it by name. Its kernels are checked case by case by the conformance suite (rms_norm_*).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The layer_norm sample with its layer norm replaced by an RMSNorm.
std::string rms_config(const fs::path& dir) {
  std::string t = read(fs::path(KILN_SOURCE_DIR) / "samples/fashion_mnist_ln_gelu.toml");
  const std::string from = "type = \"layer_norm\"";
  REQUIRE(t.find(from) != std::string::npos);
  t.replace(t.find(from), from.size(), "type = \"rms_norm\"");
  const fs::path cfg = dir / "rms.toml";
  std::ofstream(cfg) << t;
  return cfg.string();
}

std::vector<double> train_losses(const fs::path& metrics) {
  std::vector<double> v;
  std::istringstream lines(read(metrics));
  const std::regex loss("\"train_loss\":([-0-9.eE+]+)");
  for (std::string l; std::getline(lines, l);)
    if (std::smatch m; std::regex_search(l, m, loss)) v.push_back(std::stod(m[1]));
  return v;
}

std::vector<double> train(const std::string& cfg, const fs::path& out, const std::string& backend) {
  auto r = kiln::test::run_app("train " + cfg + " --set train.epochs=2 --set train.steps_per_epoch=40 --set " +
                               "'train.progress=\"none\"' --set 'device.backend=\"" + backend + "\"' --set " +
                               "'train.output_dir=\"" + out.string() + "\"'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return train_losses(out / "metrics.jsonl");
}

}  // namespace

TEST_CASE("rms_norm computes LLaMA's RMSNorm over the last axis", "[rms_norm]") {
  const auto fwd = kiln::find_op("rms_norm_forward");
  REQUIRE(fwd);
  const float eps = 1e-6f;
  const std::vector<float> x = {1, 2, 3, 4, 0, 0, 0, 0, -1, 1, -1, 1}, gamma = {1, 0.5f, 2, 1};
  std::vector<float> y(12), rstd(3);
  const float* in[] = {x.data(), gamma.data()};
  float* out[] = {y.data(), rstd.data()};
  kiln::reference_op(*fwd, kiln::LayerNormAttrs{3, 4, eps, false}, in, out);
  for (int r = 0; r < 3; ++r) {
    double sq = 0;
    for (int c = 0; c < 4; ++c) sq += double(x[r * 4 + c]) * x[r * 4 + c];
    const double rs = 1.0 / std::sqrt(sq / 4 + eps);  // torch.rsqrt(x.pow(2).mean(-1) + eps)
    CHECK(rstd[r] == Approx(rs).epsilon(1e-6));
    for (int c = 0; c < 4; ++c) CHECK(y[r * 4 + c] == Approx(x[r * 4 + c] * rs * gamma[c]).epsilon(1e-6));
  }
  CHECK(y[4] == 0.f);  // a row of zeros stays zero: no mean is subtracted, eps keeps rstd finite
  CHECK_THROWS_WITH(kiln::op_arity(*fwd, kiln::LayerNormAttrs{3, 4, eps, true}),
                    Catch::Contains("RMSNorm has no bias"));
}

TEST_CASE("a model with an rms_norm layer trains, and vulkan follows the cpu's losses", "[rms_norm][integration]") {
  const fs::path dir = kiln::test::temp_dir("rms_norm_train");
  const std::string cfg = rms_config(dir);
  const std::vector<double> cpu = train(cfg, dir / "cpu", "cpu");
  REQUIRE(cpu.size() == 2);
  CHECK(cpu[1] < cpu[0]);
  CHECK(cpu[1] < 1.0);  // 80 AdamW steps of batch 64: well below ln(10) = 2.3
  if (!kiln::test::registry().has_backend("vulkan")) KILN_SKIP("no vulkan backend in this build: cpu curve checked");
  auto devices = kiln::test::registry().backend("vulkan")(kiln::BackendOptions{})->enumerate();
  if (devices.empty()) KILN_SKIP("no Vulkan device: cpu curve checked");
  const std::vector<double> vk = train(cfg, dir / "vulkan", "vulkan");
  REQUIRE(vk.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) CHECK(vk[i] == Approx(cpu[i]).epsilon(2e-3));
}

TEST_CASE("kiln export --format onnx refuses an rms_norm layer, naming it", "[rms_norm][integration]") {
  const fs::path dir = kiln::test::temp_dir("rms_norm_export");
  const std::string cfg = rms_config(dir);
  auto t = kiln::test::run_app("train " + cfg + " --set train.max_steps=2 --set 'train.progress=\"none\"' --set " +
                               "'train.output_dir=\"" + (dir / "run").string() + "\"'");
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  const fs::path onnx = dir / "rms.onnx";
  auto x = kiln::test::run_app("export " + cfg + " --checkpoint " + (dir / "run" / "checkpoint.kiln").string() +
                               " --format onnx --output " + onnx.string());
  INFO(x.output);
  CHECK(x.exit_code != 0);
  CHECK_THAT(x.output, Catch::Contains("layer 'ln1'"));
  CHECK_FALSE(fs::exists(onnx));
}
