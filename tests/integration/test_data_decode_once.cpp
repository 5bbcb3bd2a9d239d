// kiln plan and kiln train say how each source reads its files: decoded once into memory within [data]
// decoded_budget, or streamed (and why); a bad budget is a config error naming the key.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string config(const fs::path& dir, const std::string& data_extra, const std::string& run = "run") {
  std::ostringstream os;
  os << "[model]\ninput_shape = [1, 28, 28]\n[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = "
        "\"dense\"\nunits = 10\n[train]\nepochs = 2\nbatch_size = 16\nprogress = \"none\"\noutput_dir = \""
     << (dir / run).string() << "\"\n[data]\n"
     << data_extra << "\n[data.train]\nstages = [{type = \"idx\", images = \"" << kFm
     << "train-images-idx3-ubyte.gz\", labels = \"" << kFm << "train-labels-idx1-ubyte.gz\", limit = 64}, "
     << "{type = \"scale\"}, {type = \"shuffle\", buffer = 64}]\n[data.test]\nstages = [{type = \"idx\", images = \""
     << kFm << "t10k-images-idx3-ubyte.gz\", labels = \"" << kFm << "t10k-labels-idx1-ubyte.gz\", limit = 32}]\n";
  const fs::path p = dir / (run + ".toml");
  std::ofstream(p) << os.str();
  return p.string();
}

}  // namespace

TEST_CASE("kiln plan and kiln train say how each source reads, decoded once or streaming", "[decode]") {
  if (!fs::exists(kFm + "train-images-idx3-ubyte.gz")) KILN_SKIP("Fashion-MNIST is not installed under " << kFm);
  const auto d = kiln::test::temp_dir("decode_once_app");
  // 64 examples of 28 x 28 pixels + a label byte: 50240 bytes decoded.
  auto r = kiln::test::run_app("plan " + config(d, ""));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("data.train source: decoded once: 49.1 KiB in memory (budget "));
  CHECK_THAT(r.output, Catch::Contains("data.test source: decoded once: 24.5 KiB in memory"));

  r = kiln::test::run_app("plan " + config(d, "decoded_budget = \"40KiB\""));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("data.train source: streaming: decoded set 49.1 KiB exceeds the budget 40.0 "
                                       "KiB ([data] decoded_budget)"));
  CHECK_THAT(r.output, Catch::Contains("data.test source: decoded once: 24.5 KiB"));

  r = kiln::test::run_app("train " + config(d, "decoded_budget = \"auto\""));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("data.train source: decoded once: 49.1 KiB in memory"));
  CHECK_THAT(r.output, Catch::Contains("data.test source: decoded once: 24.5 KiB in memory"));

  r = kiln::test::run_app("plan " + config(d, "decoded_budget = \"plenty\""));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("run.toml"));
  CHECK_THAT(r.output, Catch::Contains("data.decoded_budget"));
  CHECK_THAT(r.output, Catch::Contains("\"auto\""));
}

// The epoch summary lines of a run's output ("epoch 2/2: train loss ..., test accuracy ..."), without their timings.
std::string epoch_lines(const std::string& out) {
  std::istringstream in(out);
  std::string line, lines;
  while (std::getline(in, line))
    if (line.rfind("epoch ", 0) == 0 && line.find(": train loss") != std::string::npos)
      lines += line.substr(0, line.find(", test accuracy")) + "\n";
  return lines;
}

TEST_CASE("a run stopped while streaming resumes with its sources decoded once, as if uninterrupted", "[decode]") {
  if (!fs::exists(kFm + "train-images-idx3-ubyte.gz")) KILN_SKIP("Fashion-MNIST is not installed under " << kFm);
  const auto d = kiln::test::temp_dir("decode_once_resume");
  // 64 examples in batches of 16: 4 steps an epoch; the first run stops in the middle of epoch 2.
  auto whole = kiln::test::run_app("train " + config(d, "decoded_budget = \"auto\"", "whole"));
  REQUIRE(whole.exit_code == 0);
  const std::string cut = config(d, "decoded_budget = \"off\"", "cut");
  auto first = kiln::test::run_app("train " + cut + " --set train.max_steps=6");
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.output, Catch::Contains("data.train source: streaming"));
  auto rest =
      kiln::test::run_app("train " + cut + " --resume --set train.max_steps=0 --set 'data.decoded_budget=\"auto\"'");
  REQUIRE(rest.exit_code == 0);
  CHECK_THAT(rest.output, Catch::Contains("data.train source: decoded once"));
  CHECK_THAT(rest.output, Catch::Contains("mid-epoch"));
  const std::string want = epoch_lines(whole.output);
  REQUIRE(want.find("epoch 2/2") != std::string::npos);
  CHECK(epoch_lines(first.output + rest.output) == want);
}
