// [init] preset = "gpt2" against Hugging Face: a small randomly initialized transformers.GPT2LMHeadModel, saved with
// save_pretrained (safetensors), loaded into Kiln's GPT; the logits, kiln train's start and kiln predict compared
// with transformers' own. Needs torch + transformers in KILN_PYTHON or .venv-export (./setup.sh installs them);
// skipped, saying so, without them.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "kiln/config.hpp"
#include "kiln/init_from.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;

std::string python() {
  if (const char* p = std::getenv("KILN_PYTHON"); p && *p) return p;
  return std::string(KILN_SOURCE_DIR) + "/.venv-export/bin/python";
}

// Why the reference cannot be made here, or "".
std::string python_missing() {
  static const std::string why = [] {
    const auto r = kiln::test::run_shell("'" + python() + "' -c 'import torch, transformers, safetensors' 2>&1");
    return r.exit_code == 0 ? std::string()
                            : python() + " cannot import torch, transformers and safetensors (" +
                                  r.output.substr(0, 200) + "); ./setup.sh installs transformers into .venv-export";
  }();
  return why;
}

constexpr int kLayers = 2, kHeads = 2, kWidth = 64, kVocab = 100, kPositions = 32, kBatch = 3, kContext = 16;

// The reference, made once per process: model.safetensors, ids.npy, logits.npy (see gpt2_hf_reference.py).
const fs::path& reference() {
  static const fs::path dir = [] {
    const auto d = kiln::test::temp_dir("hf_gpt2");
    const std::string args = " --layers " + std::to_string(kLayers) + " --heads " + std::to_string(kHeads) +
                             " --width " + std::to_string(kWidth) + " --vocab " + std::to_string(kVocab);
    const auto r =
        kiln::test::run_shell("'" + python() + "' " + KILN_SOURCE_DIR + "/tests/integration/gpt2_hf_reference.py '" +
                              d.string() + "'" + args + " --positions " + std::to_string(kPositions) + " --batch " +
                              std::to_string(kBatch) + " --context " + std::to_string(kContext) + " 2>&1");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const auto m =
        kiln::test::run_shell("'" + python() + "' " + KILN_SOURCE_DIR + "/bench/gpt2/gpt_config.py" + args +
                              " --context " + std::to_string(kContext) + " > '" + (d / "model.toml").string() + "'");
    REQUIRE(m.exit_code == 0);
    return d;
  }();
  return dir;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A float32 .npy as numpy.save writes it (version 1, '<f4', C order): its values.
std::vector<float> read_f32_npy(const fs::path& p) {
  const std::string b = read_text(p);
  REQUIRE(b.size() > 10);
  REQUIRE(b.find("'<f4'") != std::string::npos);
  const size_t hlen = static_cast<unsigned char>(b[8]) | static_cast<size_t>(static_cast<unsigned char>(b[9])) << 8;
  std::vector<float> v((b.size() - 10 - hlen) / 4);
  std::memcpy(v.data(), b.data() + 10 + hlen, v.size() * 4);
  return v;
}

std::string run_config(const fs::path& d, const std::string& out_dir) {
  std::string t = read_text(d / "model.toml");
  t += "[run]\nname = \"hf_gpt2\"\nseed = 1\n[device]\nbackend = \"cpu\"\nmemory_limit = \"1GiB\"\n";
  t += "[init]\nfrom = \"model.safetensors\"\npreset = \"gpt2\"\n";
  // A learning rate far below float32's resolution of the weights: the checkpoint after one step holds the loaded
  // weights (kiln predict reads a checkpoint), and the step still runs the whole training graph.
  t += "[optimizer]\ntype = \"sgd\"\nlearning_rate = 1e-30\n";
  t += "[train]\nepochs = 1\nbatch_size = 3\nsteps_per_epoch = 1\nevaluate = false\nprogress = \"none\"\n";
  t += "output_dir = \"" + out_dir + "\"\n";
  t += "[data.train]\nstages = [{type = \"tokens\", path = \"tok.bin\", vocab_size = " + std::to_string(kVocab) +
       ", block_size = " + std::to_string(kContext) + "}]\n";
  return t;
}

void write_tokens(const fs::path& p) {
  std::vector<uint16_t> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 37 + 11) % kVocab);
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
}

}  // namespace

TEST_CASE("Hugging Face GPT2LMHeadModel loaded with preset gpt2 gives transformers' logits within 1e-4",
          "[init_from][hf]") {
  if (auto why = python_missing(); !why.empty()) KILN_SKIP(why);
  const fs::path& d = reference();
  write_tokens(d / "tok.bin");
  auto cfg = kiln::Config::load_string(run_config(d, (d / "unused").string()), (d / "run.toml").string());
  kiln::Session s(cfg, kiln::test::registry());
  REQUIRE(s.init());
  s.model().label_shape = kiln::Shape{kContext};
  s.open_devices();
  auto runner = s.strategy().create(s.runner_context());
  const kiln::InitialWeights w = kiln::load_initial_weights(*s.init(), s.model(), s.optimizer());
  CHECK(w.missing.empty());
  CHECK_THAT(w.summary, Catch::Contains("initialized 28 of the model's 28 parameters and buffers") &&
                            Catch::Contains("(F32; preset gpt2)"));
  runner->load_state(w.tensors);

  kiln::Element e;
  e.batch = kBatch;
  e.x = kiln::HostTensor(kiln::Shape{kBatch, kContext});
  e.y = kiln::HostTensor(kiln::Shape{kBatch, kContext});
  const std::vector<float> ids = read_f32_npy(d / "ids.npy"), want = read_f32_npy(d / "logits.npy");
  REQUIRE(ids.size() == e.x.data.size());
  e.x.data = ids;
  const kiln::EvalResult r = runner->eval_batch(e, false);
  REQUIRE(r.outputs.size() == 1);
  const kiln::HostTensor& got = r.outputs[0];
  CHECK(got.shape == kiln::Shape{kBatch, kContext, kVocab});
  REQUIRE(got.data.size() == want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got.data[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  std::cout << "Kiln vs transformers GPT2LMHeadModel logits (" << want.size() << " values, |logit| up to " << scale
            << "): max |difference| " << worst << "\n";
  CHECK(scale > 1.0);  // logits of a random model with weights of std 0.1 are not all near 0
  CHECK(worst < 1e-4);
}

TEST_CASE("kiln train starts from Hugging Face GPT-2 weights, predict matches transformers, resume keeps its own",
          "[init_from][hf]") {
  if (auto why = python_missing(); !why.empty()) KILN_SKIP(why);
  const fs::path& ref = reference();
  const auto d = kiln::test::temp_dir("hf_gpt2_run");
  fs::copy_file(ref / "model.safetensors", d / "model.safetensors");
  write_tokens(d / "tok.bin");
  const std::string cfg = (d / "run.toml").string();
  std::ofstream(cfg) << run_config(ref, (d / "out").string());
  auto r = kiln::test::run_app("train '" + cfg + "'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("initialized 28 of the model's 28 parameters and buffers (") &&
                           Catch::Contains("model.safetensors (F32; preset gpt2)"));
  // The first step's loss is the loaded model's: cross-entropy of a random model over 100 classes is near ln 100.
  auto p = kiln::test::run_app("predict '" + cfg + "' --input '" + (ref / "ids.npy").string() + "' --output '" +
                               (d / "p.npy").string() + "'");
  INFO(p.output);
  REQUIRE(p.exit_code == 0);
  const std::vector<float> probs = read_f32_npy(d / "p.npy"), logits = read_f32_npy(ref / "logits.npy");
  REQUIRE(probs.size() == logits.size());
  double worst = 0;
  for (size_t row = 0; row < logits.size() / kVocab; ++row) {
    const float* z = logits.data() + row * kVocab;
    double mx = z[0], sum = 0;
    for (int j = 1; j < kVocab; ++j) mx = std::max(mx, double(z[j]));
    for (int j = 0; j < kVocab; ++j) sum += std::exp(z[j] - mx);
    for (int j = 0; j < kVocab; ++j)
      worst = std::max(worst, std::fabs(probs[row * kVocab + j] - std::exp(z[j] - mx) / sum));
  }
  std::cout << "kiln predict vs transformers' softmax: max |difference| " << worst << "\n";
  CHECK(worst < 1e-5);
  // A resumed run continues from its checkpoint; [init] is said not to apply.
  auto again = kiln::test::run_app("train '" + cfg + "' --resume --set train.epochs=2");
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK_THAT(again.output, Catch::Contains("[init] from = \"model.safetensors\" is not applied: the run resumed from "
                                           "its own checkpoint, whose weights win") &&
                               !Catch::Contains("initialized 28"));
}

TEST_CASE("kiln train refuses a truncated init file with exit 2 before any device memory is taken", "[init_from]") {
  const auto d = kiln::test::temp_dir("init_trunc");
  // A model.safetensors as `kiln export` lays it out, cut short inside its last tensor.
  const std::string h = R"({"fc.kernel":{"dtype":"F32","shape":[4,2],"data_offsets":[0,32]},)"
                        R"("fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[32,40]}})";
  std::string file;
  for (int k = 0; k < 8; ++k) file += static_cast<char>((h.size() >> (8 * k)) & 0xff);
  file += h + std::string(36, '\0');
  std::ofstream(d / "cut.safetensors", std::ios::binary) << file;
  std::ofstream(d / "run.toml") << "[model]\ninput_shape = [4]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\n"
                                   "units = 2\n[init]\nfrom = \"cut.safetensors\"\n[train]\nprogress = \"none\"\n"
                                   "output_dir = \""
                                << (d / "out").string()
                                << "\"\n[data.train]\nstages = [{type = \"synthetic\", examples = 8, shape = [4], "
                                   "classes = 2}]\n";
  auto r = kiln::test::run_app("train '" + (d / "run.toml").string() + "'");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains((d / "cut.safetensors").string()) && Catch::Contains("tensor 'fc.bias'") &&
                           Catch::Contains("past the end of the data (36 bytes after the header)"));
  CHECK_THAT(r.output, !Catch::Contains("device cpu:0"));
}
