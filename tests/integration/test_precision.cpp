// [precision]: bfloat16 and float16 runs through the real `kiln` app on real Fashion-MNIST data (a subset): they learn,
// float16's dynamic loss scaling skips steps with non-finite gradients and keeps its scale in the checkpoint, runs
// resume bit for bit (stopped by max_steps and killed with SIGKILL), a float32 checkpoint continues in bfloat16, the
// plan shows what 16-bit storage saves, and bad [precision] keys are config errors naming file, line and key.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "kiln/checkpoint.hpp"
#include "kiln/half.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string config(const fs::path& out, const std::string& precision, int limit = 2000) {
  std::ostringstream os;
  os << "[run]\nname = \"mp\"\nseed = 5\n[device]\nbackend = \"cpu\"\nmemory_limit = \"512MiB\"\n"
     << "[precision]\n"
     << precision << "\n"
     << R"([model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 128
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 2e-3
[train]
epochs = 2
batch_size = 32
progress = "lines"
output_dir = ")"
     << out.string() << R"("
[log]
every_steps = 1
[data.train]
stages = [
  { type = "idx", images = ")"
     << kFm << R"(train-images-idx3-ubyte.gz", labels = ")" << kFm << R"(train-labels-idx1-ubyte.gz", limit = )"
     << limit << R"( },
  { type = "scale", factor = 0.00392156862745098 },
  { type = "shuffle", buffer = 3000 },
  { type = "batch" },
]
[data.test]
stages = [
  { type = "idx", images = ")"
     << kFm << R"(t10k-images-idx3-ubyte.gz", labels = ")" << kFm << R"(t10k-labels-idx1-ubyte.gz", limit = 1000 },
  { type = "scale", factor = 0.00392156862745098 },
  { type = "batch" },
]
)";
  return os.str();
}

std::string write(const fs::path& dir, const std::string& text) {
  auto p = dir / "run.toml";
  std::ofstream(p) << text;
  return p.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

double last_accuracy(const fs::path& metrics) {
  std::ifstream f(metrics);
  double acc = -1;
  std::smatch m;
  for (std::string l; std::getline(f, l);)
    if (std::regex_search(l, m, std::regex("\"test_accuracy\":([0-9.eE+-]+)"))) acc = std::stod(m[1].str());
  return acc;
}

std::string set_out(const fs::path& out) { return " --set 'train.output_dir=\"" + out.string() + "\"'"; }

const char* kFloat16 = "compute = \"float16\"\ninit_scale = 16777216\ngrowth_interval = 5\n";

}  // namespace

TEST_CASE("bfloat16 and float16 runs learn Fashion-MNIST as float32 does", "[precision][e2e]") {
  auto dir = kiln::test::temp_dir("mp_learn");
  double acc[3];
  const char* computes[] = {"compute = \"float32\"", "compute = \"bfloat16\"", kFloat16};
  for (int i = 0; i < 3; ++i) {
    const fs::path out = dir / ("out" + std::to_string(i));
    auto r = kiln::test::run_app("train " + write(dir, config(out, computes[i])));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    acc[i] = last_accuracy(out / "metrics.jsonl");
    if (i == 2) {  // float16: the progress line and every step record carry the loss scale and the skipped steps
      CHECK_THAT(r.output, Catch::Contains("loss_scale ") && Catch::Contains("skipped "));
      CHECK_THAT(slurp(out / "metrics.jsonl"), Catch::Contains("\"loss_scale\":") && Catch::Contains("\"skipped\":"));
      CHECK_THAT(r.output, Catch::Contains("note: cpu:0: float16 on the cpu backend"));
    }
  }
  CAPTURE(acc[0], acc[1], acc[2]);
  CHECK(acc[0] > 0.75);
  // 2 epochs of 2000 examples: 16-bit storage moves the accuracy by a point or two at most.
  CHECK(std::abs(acc[1] - acc[0]) < 0.03);
  CHECK(std::abs(acc[2] - acc[0]) < 0.03);
}

TEST_CASE("float16's loss scale backs off on a non-finite gradient, skips that update and grows after finite steps",
          "[precision]") {
  auto dir = kiln::test::temp_dir("mp_scale");
  const fs::path out = dir / "out";
  // 2^28 overflows float16's gradients (largest 65504) at once: the first steps are skipped and the scale halves
  // until they are finite, then doubles after every 5 finite steps.
  auto r = kiln::test::run_app(
      "train " + write(dir, config(out, "compute = \"float16\"\ninit_scale = 268435456\ngrowth_interval = 5\n", 640)) +
      " --set train.epochs=1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::ifstream f(out / "metrics.jsonl");
  std::vector<double> scales;
  std::vector<bool> skipped;
  std::smatch m;
  for (std::string l; std::getline(f, l);) {
    if (l.find("\"event\":\"step\"") == std::string::npos) continue;
    REQUIRE(std::regex_search(l, m, std::regex("\"loss_scale\":([0-9.eE+-]+),\"skipped\":(true|false)")));
    scales.push_back(std::stod(m[1].str()));
    skipped.push_back(m[2].str() == "true");
  }
  REQUIRE(scales.size() == 20);
  CHECK(skipped[0]);
  // metrics.jsonl prints 8 significant digits
  auto same = [](double a, double b) { return std::abs(a / b - 1) < 1e-6; };
  CHECK(same(scales[0], 268435456.0));
  int finite_run = 0, grew = 0;
  for (size_t i = 1; i < scales.size(); ++i) {
    CAPTURE(i, scales[i - 1], scales[i]);
    finite_run = skipped[i - 1] ? 0 : finite_run + 1;
    if (skipped[i - 1])
      CHECK(same(scales[i], scales[i - 1] / 2));  // backoff 0.5 after a skipped step
    else if (finite_run == 5) {                   // growth 2 after 5 finite steps
      CHECK(same(scales[i], scales[i - 1] * 2));
      finite_run = 0;
      ++grew;
    } else
      CHECK(same(scales[i], scales[i - 1]));
  }
  CHECK(grew >= 1);
  CHECK(std::count(skipped.begin(), skipped.end(), false) >= 10);
}

TEST_CASE("16-bit runs resume bit for bit: stopped at max_steps, killed with SIGKILL, or from a float32 checkpoint",
          "[precision][resume]") {
  auto dir = kiln::test::temp_dir("mp_resume");
  for (const std::string& precision : {std::string("compute = \"bfloat16\""), std::string(kFloat16)}) {
    CAPTURE(precision);
    auto cfg = write(dir, config(dir / "full", precision, 1000));
    REQUIRE(kiln::test::run_app("train " + cfg + " --overwrite").exit_code == 0);
    const std::string full = slurp(dir / "full" / "checkpoint.kiln");
    REQUIRE(!full.empty());
    if (precision == kFloat16) {  // the checkpoint holds the scaler's state (scale, finite run, skipped steps)
      const kiln::Checkpoint c = kiln::load_checkpoint((dir / "full" / "checkpoint.kiln").string());
      REQUIRE(c.tensors.count("precision/loss_scale"));
      CHECK(c.tensors.at("precision/loss_scale").data.size() == 3);
    }
    const fs::path cut = dir / "cut";
    auto a = kiln::test::run_app("train " + cfg + set_out(cut) + " --overwrite --set train.max_steps=45");
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    auto b = kiln::test::run_app("train " + cfg + set_out(cut) + " --resume");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    CHECK(slurp(cut / "checkpoint.kiln") == full);

    // SIGKILL mid-epoch: the run continues from its last step checkpoint and ends the same.
    const fs::path killed = dir / "killed";
    fs::remove_all(killed);
    const std::string log = (dir / "kill.log").string();
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const std::string cmd = "exec " + std::string(KILN_APP) + " train " + cfg + set_out(killed) +
                              " --set train.checkpoint_every_steps=7 > " + log + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 6000 && !fs::exists(killed / "checkpoint.kiln"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    auto c = kiln::test::run_app("train " + cfg + set_out(killed) + " --resume --set train.checkpoint_every_steps=7");
    INFO(c.output);
    REQUIRE(c.exit_code == 0);
    CHECK(slurp(killed / "checkpoint.kiln") == full);
  }
  // A float32 run's checkpoint continues in bfloat16 ([precision] may change on a resume) and trains on.
  auto f32 = write(dir, config(dir / "mixed", "compute = \"float32\"", 1000));
  REQUIRE(kiln::test::run_app("train " + f32 + " --set train.epochs=1").exit_code == 0);
  auto bf = kiln::test::run_app("train " + f32 + " --resume --set 'precision.compute=\"bfloat16\"'");
  INFO(bf.output);
  CHECK(bf.exit_code == 0);
  CHECK(last_accuracy(dir / "mixed" / "metrics.jsonl") > 0.6);
}

TEST_CASE("kiln plan shows the precision and the float32 plan beside it", "[precision][plan]") {
  const std::string cnn = std::string(KILN_SOURCE_DIR) + "/samples/fashion_mnist_cnn.toml";
  auto r = kiln::test::run_app("plan " + cnn + " --set 'precision.compute=\"bfloat16\"'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("precision: compute bfloat16"));
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex(R"(\((\d+)%\), step total)")));
  // The convolutions' activations make the arena: 16-bit storage halves it.
  CHECK(std::stoi(m[1].str()) <= 55);
  auto f = kiln::test::run_app("plan " + cnn);
  CHECK_THAT(f.output, Catch::Contains("precision: float32"));
}

TEST_CASE("bad [precision] keys are config errors naming the key and what is allowed", "[precision]") {
  auto dir = kiln::test::temp_dir("mp_bad");
  struct Bad {
    std::string precision, expect;
  } cases[] = {
      {"compute = \"bf16\"", "'precision.compute'"},
      {"compute = \"bfloat16\"\nloss_scale = \"dynamic\"", "needs none"},
      {"compute = \"bfloat16\"\ninit_scale = 1024", "only used with loss_scale = \"dynamic\""},
      {"compute = \"float16\"\nbackoff_factor = 2", "expected a number in (0, 1)"},
      {"compute = \"float16\"\ngrowth = 2", "unknown key 'growth'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.precision);
    auto r = kiln::test::run_app("train " + write(dir, config(dir / "out", c.precision)));
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("run.toml:") && Catch::Contains(c.expect));
    CHECK_FALSE(fs::exists(dir / "out" / "checkpoint.kiln"));
  }
  // A layer's precision key takes the same names.
  std::string text = config(dir / "out", "compute = \"bfloat16\"");
  text = std::regex_replace(text, std::regex("units = 10\n"), "units = 10\nprecision = \"half\"\n");
  auto r = kiln::test::run_app("train " + write(dir, text));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("precision") && Catch::Contains("float32") && Catch::Contains("bfloat16"));
}

TEST_CASE("kiln export --dtype writes bfloat16 and float16 safetensors rounded from the float32 weights",
          "[precision][export]") {
  auto dir = kiln::test::temp_dir("mp_export");
  auto cfg = write(dir, config(dir / "out", "compute = \"bfloat16\"", 320));
  REQUIRE(kiln::test::run_app("train " + cfg + " --set train.epochs=1").exit_code == 0);
  std::string files[3];
  const char* types[] = {"float32", "bfloat16", "float16"};
  for (int i = 0; i < 3; ++i) {
    const fs::path out = dir / (std::string(types[i]) + ".safetensors");
    auto r = kiln::test::run_app("export " + cfg + " --format safetensors --dtype " + types[i] + " --output " +
                                 out.string());
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    files[i] = slurp(out);
  }
  auto body = [](const std::string& f) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(f[i])) << (8 * i);
    return std::make_pair(f.substr(8, n), f.substr(8 + n));
  };
  const auto [h32, d32] = body(files[0]);
  CHECK_THAT(h32, Catch::Contains("\"dtype\":\"F32\""));
  for (int i = 1; i < 3; ++i) {
    const auto [h, d] = body(files[i]);
    CHECK_THAT(h, Catch::Contains(i == 1 ? "\"dtype\":\"BF16\"" : "\"dtype\":\"F16\""));
    REQUIRE(d.size() * 2 == d32.size());
    size_t bad = 0;
    for (size_t k = 0; k < d.size() / 2; ++k) {
      float f;
      std::memcpy(&f, d32.data() + 4 * k, 4);
      uint16_t v;
      std::memcpy(&v, d.data() + 2 * k, 2);
      bad += v != (i == 1 ? kiln::float_to_bf16(f) : kiln::float_to_f16(f));
    }
    CHECK(bad == 0);
  }
  auto onnx =
      kiln::test::run_app("export " + cfg + " --format onnx --dtype bfloat16 --output " + (dir / "m.onnx").string());
  CHECK(onnx.exit_code == 2);
  CHECK_THAT(onnx.output, Catch::Contains("--dtype bfloat16 applies to --format safetensors"));
}
