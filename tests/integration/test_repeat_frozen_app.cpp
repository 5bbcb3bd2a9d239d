// Through the real app: samples/shakespeare_char.toml (its transformer block written once, repeat = 4) trains on
// tiny Shakespeare to the same losses and the same checkpoint, byte for byte, as its hand-written form
// (tests/fixtures/shakespeare_char_unrolled.toml); kiln plan prints what frozen layers do not allocate; kiln sample
// reads a frozen layer's weights from the checkpoint.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "test_support.hpp"

namespace {

const std::string kSample = std::string(KILN_SOURCE_DIR) + "/samples/shakespeare_char.toml";
const std::string kUnrolled = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/shakespeare_char_unrolled.toml";

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Two steps of the config at `cfg`, a test pass of 24 windows, into `out`.
kiln::test::AppResult short_run(const std::string& cfg, const std::filesystem::path& out,
                                const std::string& extra = "") {
  return kiln::test::run_app("train " + cfg +
                             " --set train.max_steps=2 --set train.epochs=1 --set train.steps_per_epoch=2"
                             " --set train.progress=none --set 'data.test.stages[0].examples_per_epoch=24'"
                             " --set train.output_dir=" +
                             out.string() + " " + extra);
}

}  // namespace

TEST_CASE("kiln train: the repeated-block sample and its hand-written form give the same losses and checkpoint",
          "[repeat][e2e]") {
  const auto dir = kiln::test::temp_dir("repeat_app");
  const auto a = short_run(kSample, dir / "repeat"), b = short_run(kUnrolled, dir / "unrolled");
  INFO(a.output);
  INFO(b.output);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  const std::string ma = read_file(dir / "repeat" / "metrics.jsonl"),
                    mb = read_file(dir / "unrolled" / "metrics.jsonl");
  std::smatch la, lb;
  const std::regex loss("\"train_loss\":([0-9.e+-]+),\"test_loss\":([0-9.e+-]+)");
  REQUIRE(std::regex_search(ma, la, loss));
  REQUIRE(std::regex_search(mb, lb, loss));
  CHECK(la[1] == lb[1]);  // printed with float's 9 significant digits: the same bits
  CHECK(la[2] == lb[2]);
  CHECK(std::stod(la[1]) > 3.5);  // a few steps from ln(65) = 4.17
  const std::string ca = read_file(dir / "repeat" / "checkpoint.kiln"),
                    cb = read_file(dir / "unrolled" / "checkpoint.kiln");
  CHECK(ca.size() > 3000000);  // 804,096 weights and Adam's two moments
  CHECK(ca == cb);
}

TEST_CASE("kiln plan prints what trainable = false does not allocate, and kiln sample reads frozen weights",
          "[frozen][e2e]") {
  // The repeat table's trainable = false freezes every layer of every repetition: 4 x 7 layers, of which 4 x 5 hold
  // weights, 4 x 196,864 of them.
  const auto p = kiln::test::run_app("plan " + kSample + " --set 'model.layers[2].trainable=false'");
  INFO(p.output);
  REQUIRE(p.exit_code == 0);
  CHECK_THAT(p.output, Catch::Contains("frozen: 20 layers (787456 parameters), 9.0 MiB of gradients and optimizer "
                                       "state not allocated (3.0 MiB + 6.0 MiB)"));
  CHECK_THAT(p.output, Catch::Contains("gradients             65.0 KiB"));
  const auto full = kiln::test::run_app("plan " + kSample);
  CHECK_THAT(full.output, Catch::Contains("gradients              3.1 MiB"));
  CHECK_THAT(full.output, !Catch::Contains("frozen:"));

  // A frozen embedding (the token table, tied to lm_head) trained for two steps, then sampled: kiln sample must
  // load the frozen table from the checkpoint like any weight (it read parameters only, so a frozen table came
  // from the initializer under another seed and the text changed).
  const auto dir = kiln::test::temp_dir("frozen_sample");
  const std::string frozen = "--set 'model.layers[0].trainable=false'";
  const auto t = short_run(kSample, dir / "run", frozen + " --set run.seed=3");
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  const std::string common =
      " --set train.output_dir=" + (dir / "run").string() + " " + frozen + " --prompt 'ROMEO:' --tokens 40 --seed 5";
  const auto s1 = kiln::test::run_app("sample " + kSample + common + " --set run.seed=3");
  const auto s2 = kiln::test::run_app("sample " + kSample + common + " --set run.seed=4");
  INFO(s1.output);
  INFO(s2.output);
  REQUIRE(s1.exit_code == 0);
  REQUIRE(s2.exit_code == 0);
  CHECK(s1.output == s2.output);  // the weights come from the checkpoint, whatever the run's seed
}
