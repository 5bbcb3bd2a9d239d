// Using a trained model: kiln evaluate, predict and export on a tiny MLP trained on Fashion-MNIST.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <tuple>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;
const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string mlp_config(const std::string& out_dir, int units = 64) {
  std::ostringstream os;
  os << "[run]\nname = \"use\"\nseed = 3\n[device]\nbackend = \"cpu\"\nmemory_limit = \"512MiB\"\n"
     << "[model]\ninput_shape = [1, 28, 28]\nloss = \"softmax_cross_entropy\"\n"
     << "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\nunits = " << units
     << "\nactivation = \"relu\"\n[[model.layers]]\ntype = \"dense\"\nunits = 10\n"
     << "[optimizer]\ntype = \"adam\"\nlearning_rate = 2e-3\nema = 0.99\n"
     << "[train]\nepochs = 2\nbatch_size = 32\nprogress = \"none\"\noutput_dir = \"" << out_dir << "\"\n"
     << "[data.train]\nstages = [\n  { type = \"idx\", images = \"" << kFm
     << "train-images-idx3-ubyte.gz\", labels = \"" << kFm
     << "train-labels-idx1-ubyte.gz\", limit = 2000 },\n  { type = \"scale\", factor = 0.00392156862745098 },\n"
     << "  { type = \"shuffle\", buffer = 2000 },\n  { type = \"batch\" },\n]\n"
     << "[data.test]\nstages = [\n  { type = \"idx\", images = \"" << kFm << "t10k-images-idx3-ubyte.gz\", labels = \""
     << kFm << "t10k-labels-idx1-ubyte.gz\", limit = 1000 },\n  { type = \"scale\", factor = 0.00392156862745098 },\n"
     << "  { type = \"batch\" },\n]\n";
  return os.str();
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

double json_field(const std::string& text, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":([-0-9.eE+]+)");
  REQUIRE(std::regex_search(text, m, re));
  return std::stod(m[1]);
}

std::string last_line(const std::string& text) {
  std::istringstream is(text);
  std::string l, last;
  while (std::getline(is, l))
    if (!l.empty()) last = l;
  return last;
}

// The first `n` Fashion-MNIST test labels.
std::vector<int> test_labels(int n) {
  gzFile f = gzopen((kFm + "t10k-labels-idx1-ubyte.gz").c_str(), "rb");
  REQUIRE(f);
  std::vector<unsigned char> b(static_cast<size_t>(8 + n));
  REQUIRE(gzread(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  gzclose(f);
  return std::vector<int>(b.begin() + 8, b.end());
}

// A trained run shared by the test cases (trained once per process).
const fs::path& trained_run() {
  static fs::path dir = [] {
    auto d = kiln::test::temp_dir("use_model");
    auto cfg = write(d / "run.toml", mlp_config((d / "out").string()));
    auto r = kiln::test::run_app("train " + cfg);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return d;
  }();
  return dir;
}

}  // namespace

TEST_CASE("kiln evaluate gives the training run's last test loss and accuracy and writes them as JSON", "[use_model]") {
  const fs::path& d = trained_run();
  const std::string cfg = (d / "run.toml").string();
  auto r = kiln::test::run_app("evaluate " + cfg);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("ema weights"));
  const std::string last = last_line(read(d / "out" / "metrics.jsonl"));
  const std::string ev = read(d / "out" / "evaluate_test.json");
  // The trainer evaluates with the EMA weights ([optimizer] ema); evaluate loads them: the same numbers.
  CHECK(json_field(ev, "loss") == Approx(json_field(last, "test_loss")).epsilon(1e-7));
  CHECK(json_field(ev, "accuracy") == json_field(last, "test_accuracy"));
  CHECK(json_field(ev, "examples") == 1000);
  CHECK(json_field(ev, "step") == json_field(last, "step"));

  auto raw = kiln::test::run_app("evaluate " + cfg + " --weights raw --data train");
  INFO(raw.output);
  REQUIRE(raw.exit_code == 0);
  const std::string evr = read(d / "out" / "evaluate_train.json");
  CHECK_THAT(evr, Catch::Contains("\"weights\":\"raw\""));
  CHECK(json_field(evr, "examples") == 2000);
}

TEST_CASE("kiln evaluate refuses a missing, damaged or mismatched checkpoint and an unknown pipeline (exit 2)",
          "[use_model]") {
  const fs::path& d = trained_run();
  const std::string cfg = (d / "run.toml").string();
  auto none = kiln::test::run_app("evaluate " + cfg + " --checkpoint " + (d / "nope.kiln").string());
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.output, Catch::Contains("no checkpoint there"));

  std::string bytes = read(d / "out" / "checkpoint.kiln");
  bytes[bytes.size() / 2] ^= 0x5a;
  write(d / "damaged.kiln", bytes);
  auto damaged = kiln::test::run_app("evaluate " + cfg + " --checkpoint " + (d / "damaged.kiln").string());
  CHECK(damaged.exit_code == 2);
  CHECK_THAT(damaged.output, Catch::Contains("checksum mismatch"));

  auto other = write(d / "other.toml", mlp_config((d / "out").string(), 32));
  auto mismatch = kiln::test::run_app("evaluate " + other);
  INFO(mismatch.output);
  CHECK(mismatch.exit_code == 2);
  CHECK_THAT(mismatch.output, Catch::Contains("'dense_1.bias/ema'") || Catch::Contains("'dense_1.kernel/ema'"));
  CHECK_THAT(mismatch.output, Catch::Contains("(64)") || Catch::Contains("(784, 64)"));
  CHECK_THAT(mismatch.output, Catch::Contains("(32)") || Catch::Contains("(784, 32)"));

  auto nodata = kiln::test::run_app("evaluate " + cfg + " --data valid");
  CHECK(nodata.exit_code == 2);
  CHECK_THAT(nodata.output, Catch::Contains("[data.valid]"));
}

TEST_CASE("kiln predict writes one row of class probabilities per example whose argmax accuracy is evaluate's",
          "[use_model]") {
  const fs::path& d = trained_run();
  const std::string cfg = (d / "run.toml").string();
  const fs::path csv = d / "preds.csv";
  fs::remove(csv);
  auto r = kiln::test::run_app("predict " + cfg + " --output " + csv.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::istringstream is(read(csv));
  std::string line;
  std::getline(is, line);
  CHECK(line == "class_0,class_1,class_2,class_3,class_4,class_5,class_6,class_7,class_8,class_9");
  const auto labels = test_labels(1000);
  int rows = 0, correct = 0;
  double worst = 0;
  while (std::getline(is, line)) {
    std::vector<double> p;
    std::stringstream ls(line);
    for (std::string v; std::getline(ls, v, ',');) p.push_back(std::stod(v));
    REQUIRE(p.size() == 10);
    double sum = 0;
    for (double v : p) sum += v;
    worst = std::max(worst, std::abs(sum - 1));
    const auto best = std::max_element(p.begin(), p.end()) - p.begin();
    correct += best == labels.at(static_cast<size_t>(rows));
    ++rows;
  }
  CHECK(rows == 1000);
  CHECK(worst < 1e-5);
  auto ev = kiln::test::run_app("evaluate " + cfg);
  REQUIRE(ev.exit_code == 0);
  CHECK(correct / 1000.0 == json_field(read(d / "out" / "evaluate_test.json"), "accuracy"));

  // Never overwrites a user's file without --overwrite.
  auto again = kiln::test::run_app("predict " + cfg + " --output " + csv.string());
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output, Catch::Contains("--overwrite"));

  // .npy: the same values, float32, (1000, 10); and --input .npy of model inputs gives the same rows.
  const fs::path npy = d / "preds.npy";
  REQUIRE(kiln::test::run_app("predict " + cfg + " --overwrite --output " + npy.string()).exit_code == 0);
  const std::string b = read(npy);
  REQUIRE(b.compare(0, 6, "\x93NUMPY") == 0);
  const size_t hlen = static_cast<unsigned char>(b[8]) | static_cast<size_t>(static_cast<unsigned char>(b[9])) << 8;
  CHECK((10 + hlen) % 64 == 0);
  CHECK_THAT(b.substr(10, hlen), Catch::Contains("'descr': '<f4'") && Catch::Contains("'shape': (1000, 10)"));
  REQUIRE(b.size() == 10 + hlen + 1000 * 10 * 4);
}

TEST_CASE("kiln export writes safetensors whose tensors are the checkpoint's, EMA or raw", "[use_model]") {
  const fs::path& d = trained_run();
  const std::string cfg = (d / "run.toml").string();
  const kiln::Checkpoint ck = kiln::load_checkpoint((d / "out" / "checkpoint.kiln").string());
  for (const std::string weights : {"ema", "raw"}) {
    const fs::path out = d / ("model_" + weights + ".safetensors");
    fs::remove(out);
    auto r = kiln::test::run_app("export " + cfg + " --format safetensors --weights " + weights + " --output " +
                                 out.string());
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const std::string b = read(out);
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    REQUIRE(8 + n <= b.size());
    const std::string header = b.substr(8, n);
    CHECK_THAT(header, Catch::Contains("\"weights\":\"" + weights + "\""));
    size_t end = 0;
    for (const std::string name : {"dense_1.kernel", "dense_1.bias", "dense_2.kernel", "dense_2.bias"}) {
      std::smatch m;
      const std::string h = header;
      std::regex re("\"" + std::regex_replace(name, std::regex("\\."), "\\.") +
                    "\":\\{\"dtype\":\"F32\",\"shape\":\\[([0-9,]*)\\],\"data_offsets\":\\[([0-9]+),([0-9]+)\\]\\}");
      REQUIRE(std::regex_search(h, m, re));
      const kiln::HostTensor& t = ck.tensors.at(weights == "ema" ? name + "/ema" : name);
      std::string dims;
      for (auto x : t.shape.dims()) {
        if (!dims.empty()) dims += ',';
        dims += std::to_string(x);
      }
      CHECK(m[1].str() == dims);
      const size_t a = std::stoull(m[2]), z = std::stoull(m[3]);
      REQUIRE(z - a == t.bytes());
      CHECK(std::memcmp(b.data() + 8 + n + a, t.data.data(), t.bytes()) == 0);
      end = std::max(end, z);
    }
    CHECK(8 + n + end == b.size());
  }
  auto again =
      kiln::test::run_app("export " + cfg + " --format safetensors --output " + (d / "model_raw.safetensors").string());
  CHECK(again.exit_code == 2);
}

TEST_CASE(
    "exported safetensors in PyTorch and ONNX in ONNX Runtime give kiln predict's outputs (MLP, CNN, ResNet, GPT)",
    "[use_model][python]") {
  const char* env = std::getenv("KILN_PYTHON");
  const std::string venv = std::string(KILN_SOURCE_DIR) + "/.venv-export/bin/python";  // ./setup.sh test makes it
  const std::string py = env ? env : fs::exists(venv) ? venv : "python3";
  if (std::system((py + " -c 'import torch, safetensors, onnx, onnxruntime, numpy' >/dev/null 2>&1").c_str()) != 0)
    KILN_SKIP(py << " lacks torch, safetensors, onnx, onnxruntime or numpy (./setup.sh test makes .venv-export where "
                    "Debian's python3-torch is installed; or set KILN_PYTHON to a Python that has them)");
  const fs::path& d = trained_run();
  const std::string script = std::string(KILN_SOURCE_DIR) + "/bench/accuracy/check_export.py";
  auto check = [&](const std::string& cfg, const std::string& work, const std::string& extra) {
    const std::string cmd = py + " " + script + " --kiln " + KILN_APP + " --config " + cfg + " --workdir " + work +
                            " " + extra + " > " + work + ".log 2>&1";
    const int rc = std::system(cmd.c_str());
    INFO(read(work + ".log"));
    CHECK(rc == 0);
    CHECK_THAT(read(work + ".log"), Catch::Contains("onnx.checker: ok") && Catch::Contains("OK"));
  };
  check((d / "run.toml").string(), (d / "check_mlp").string(), "--examples 300");
  // A CNN: the CNN sample's layers, trained for 20 steps.
  std::string cnn = read(std::string(KILN_SOURCE_DIR) + "/samples/fashion_mnist_cnn.toml");
  cnn = std::regex_replace(
      cnn, std::regex("\\[train\\]\n"),
      "[train]\nsteps_per_epoch = 20\nprogress = \"none\"\noutput_dir = \"" + (d / "cnn_out").string() + "\"\n");
  cnn = std::regex_replace(cnn, std::regex("epochs = 2"), "epochs = 1");
  const std::string cnn_cfg = write(d / "cnn.toml", cnn);
  auto r = kiln::test::run_app("train " + cnn_cfg + " --overwrite");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  check(cnn_cfg, (d / "check_cnn").string(), "--examples 300");
  // The samples as they are, trained a few steps: the ResNet (batch_norm with its running statistics, residual adds,
  // global average pooling) and the character GPT (embedding, positional_embedding, layer_norm, attention, gelu,
  // a tied head whose (64, 65) outputs are a distribution per position).
  for (const auto& [sample, steps, extra] :
       {std::tuple<std::string, int, std::string>{"resnet_fashion_mnist", 10, "--examples 100"},
        {"shakespeare_char", 3, "--inputs ids --examples 16"}}) {
    const std::string cfg = std::string(KILN_SOURCE_DIR) + "/samples/" + sample + ".toml";
    const fs::path out = d / (sample + "_out");
    auto t = kiln::test::run_app("train " + cfg + " --overwrite --set train.max_steps=" + std::to_string(steps) +
                                 " --set 'train.progress=\"none\"' --set 'train.output_dir=\"" + out.string() + "\"'");
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    check(cfg, (d / ("check_" + sample)).string(), extra + " --checkpoint " + (out / "checkpoint.kiln").string());
  }
}

TEST_CASE("kiln predict gives a sequence head one distribution per position and reads batch norm's running statistics",
          "[use_model]") {
  auto d = kiln::test::temp_dir("predict_seq");
  const std::string gpt = std::string(KILN_SOURCE_DIR) + "/samples/shakespeare_char.toml";
  auto t = kiln::test::run_app("train " + gpt +
                               " --set train.max_steps=2 --set 'train.progress=\"none\"' --set 'train.output_dir=\"" +
                               (d / "gpt").string() + "\"'");
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  const fs::path csv = d / "gpt.csv";
  auto p = kiln::test::run_app("predict " + gpt + " --checkpoint " + (d / "gpt" / "checkpoint.kiln").string() +
                               " --data test --output " + csv.string());
  INFO(p.output);
  REQUIRE(p.exit_code == 0);
  std::istringstream lines(read(csv));
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  CHECK(header.rfind("p0.class_0,p0.class_1,", 0) == 0);
  CHECK_THAT(header, Catch::Contains(",p63.class_64"));
  std::vector<double> v;
  std::stringstream rs(row);
  for (std::string c; std::getline(rs, c, ',');) v.push_back(std::stod(c));
  REQUIRE(v.size() == 64 * 65);
  for (int pos : {0, 31, 63}) {  // each position's 65 probabilities sum to 1 (not the row's 4160)
    double s = 0;
    for (int c = 0; c < 65; ++c) s += v[static_cast<size_t>(pos * 65 + c)];
    CHECK(s == Approx(1.0).epsilon(1e-5));
  }

  // Its ONNX graph (checked against ONNX Runtime by the [python] case) holds the ops of a GPT block.
  const fs::path onnx = d / "gpt.onnx";
  auto x = kiln::test::run_app("export " + gpt + " --checkpoint " + (d / "gpt" / "checkpoint.kiln").string() +
                               " --format onnx --output " + onnx.string());
  INFO(x.output);
  REQUIRE(x.exit_code == 0);
  const std::string graph = read(onnx);
  for (const char* op : {"LayerNormalization", "Erf", "Gather", "Transpose", "MatMul", "causal_mask/64", "Softmax"})
    CHECK_THAT(graph, Catch::Contains(op));

  // A batch-norm model: its checkpoint holds running statistics, which evaluate and predict read (once refused as
  // "a tensor the model has no parameter for").
  const std::string resnet = std::string(KILN_SOURCE_DIR) + "/samples/resnet_fashion_mnist.toml";
  auto r = kiln::test::run_app("train " + resnet +
                               " --set train.max_steps=3 --set 'train.progress=\"none\"' --set 'train.output_dir=\"" +
                               (d / "resnet").string() + "\"'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto e = kiln::test::run_app("evaluate " + resnet + " --set 'train.output_dir=\"" + (d / "resnet").string() +
                               "\"' --set 'data.test.stages[0].limit=300'");
  INFO(e.output);
  CHECK(e.exit_code == 0);
  CHECK_THAT(e.output, Catch::Contains("300 examples") && Catch::Contains("accuracy"));
  CHECK(fs::exists(d / "resnet" / "evaluate_test.json"));
}
