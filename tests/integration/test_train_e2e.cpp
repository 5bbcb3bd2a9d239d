// End to end: the real `kiln` app on real Fashion-MNIST data (a subset), and its exit codes and messages. Input that
// used to crash or pass silently (a config path that is a directory, a bad --plugin-dir, a thread count the host
// cannot use, a plugin with a null entry, a run name or output directory that would write somewhere else) is refused
// with exit code 2, naming what is wrong.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

std::string mlp_config(const std::string& out_dir, const std::string& extra_train = "", int limit = 3000) {
  std::ostringstream os;
  os << R"([run]
name = "e2e"
seed = 3
[device]
backend = "cpu"
memory_limit = "512MiB"
[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 64
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 2e-3
[train]
epochs = 3
batch_size = 32
progress = "lines"
output_dir = ")"
     << out_dir << "\"\n"
     << extra_train << R"(
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

std::string write(const std::filesystem::path& dir, const std::string& name, const std::string& text) {
  auto p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);) v.push_back(l);
  return v;
}

double json_field(const std::string& line, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":([-0-9.eE+]+)");
  REQUIRE(std::regex_search(line, m, re));
  return std::stod(m[1]);
}

// A small run that trains in well under a second; `run` and `train` are extra lines for those tables.
std::string write_run(const fs::path& dir, const std::string& run, const std::string& train) {
  std::ofstream(dir / "run.toml") << "[run]\n"
                                  << run << "\n[device]\nbackend = \"cpu\"\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 3\n"
                                  << "[train]\nepochs = 1\nbatch_size = 8\nprogress = \"none\"\n"
                                  << train << "\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], classes = 3, "
                                     "examples = 16}]\n";
  return (dir / "run.toml").string();
}

}  // namespace

TEST_CASE("kiln train learns Fashion-MNIST: loss falls and test accuracy passes a threshold", "[e2e]") {
  auto dir = kiln::test::temp_dir("e2e");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string()));
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("examples/s"));
  CHECK_THAT(r.output, Catch::Contains("s/batch"));
  auto metrics = lines_of((dir / "out" / "metrics.jsonl").string());
  REQUIRE(metrics.size() == 3);
  double l1 = json_field(metrics[0], "train_loss"), l3 = json_field(metrics[2], "train_loss");
  CHECK(l3 < 0.8 * l1);
  CHECK(json_field(metrics[2], "test_accuracy") > 0.72);
  CHECK(std::filesystem::exists(dir / "out" / "checkpoint.kiln"));
}

TEST_CASE("kiln train resumes from its checkpoint", "[e2e]") {
  auto dir = kiln::test::temp_dir("resume");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 600));
  REQUIRE(kiln::test::run_app("train " + cfg + " --set train.epochs=1").exit_code == 0);
  auto r = kiln::test::run_app("train " + cfg + " --set train.epochs=2 --resume");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("resumed from"));
  CHECK_THAT(r.output, Catch::Contains("epoch 2/2"));
  CHECK_FALSE(r.output.find("epoch 1/2:") != std::string::npos);
  CHECK(lines_of((dir / "out" / "metrics.jsonl").string()).size() == 2);
}

TEST_CASE("a non-finite loss stops the run naming the step and the layer", "[e2e]") {
  auto dir = kiln::test::temp_dir("nan");
  auto text = mlp_config((dir / "out").string(), "", 600);
  text = std::regex_replace(text, std::regex("type = \"adam\"\nlearning_rate = 2e-3"),
                            "type = \"sgd\"\nlearning_rate = 1e35");
  auto cfg = write(dir, "run.toml", text);
  auto r = kiln::test::run_app("train " + cfg);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("at step"));
  CHECK_THAT(r.output, Catch::Contains("first layer whose output is non-finite is 'dense_"));
}

TEST_CASE("config errors exit with code 2 and name the line and key", "[e2e]") {
  auto dir = kiln::test::temp_dir("cfgerr");
  std::string good = mlp_config((dir / "out").string());
  struct Case {
    std::string from, to, expect;
  };
  std::vector<Case> cases = {
      {"units = 64", "unitz = 64", "unitz"},                    // unknown key
      {"units = 64", "units = \"64\"", "expected an integer"},  // wrong type
      {"epochs = 3", "epochs = -1", "train.epochs"},            // bad value
      {"backend = \"cpu\"", "backend = \"tpu\"", "device.backend"},
  };
  for (const auto& c : cases) {
    auto text = good;
    text.replace(text.find(c.from), c.from.size(), c.to);
    auto cfg = write(dir, "bad.toml", text);
    auto r = kiln::test::run_app("train " + cfg);
    INFO(c.to << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(c.expect));
    CHECK_THAT(r.output, Catch::Contains("bad.toml:"));
  }
  auto r = kiln::test::run_app("train " + (dir / "missing.toml").string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("missing.toml"));
  r = kiln::test::run_app("train");  // usage error
  CHECK(r.exit_code == 2);
}

TEST_CASE(
    "a config path that is a directory, a missing or non-directory --plugin-dir, an empty visible list and an "
    "empty input_shape are refused with exit code 2",
    "[hardening][config]") {
  auto dir = kiln::test::temp_dir("hard-inputs");
  auto r = kiln::test::run_app("train " + dir.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("expected a TOML file, found a directory"));

  r = kiln::test::run_app("--plugin-dir " + (dir / "missing").string() + " plugins");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--plugin-dir") && Catch::Contains("does not exist"));
  std::ofstream(dir / "file") << "x";
  r = kiln::test::run_app("--plugin-dir " + (dir / "file").string() + " plugins");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--plugin-dir") && Catch::Contains("is actually a file"));

  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\nvisible = []\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], examples = 8}]\n";
  r = kiln::test::run_app("plan " + (dir / "run.toml").string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("device.visible") && Catch::Contains("at least one device index"));
  r = kiln::test::run_app("plan " + (dir / "run.toml").string() +
                          " --set 'device.visible=[0]' --set 'model.input_shape=[]'");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.input_shape") && Catch::Contains("at least one dimension"));
}

TEST_CASE("kiln train with [device] threads = 100000 is a config error with exit code 2, not an abort",
          "[hardening][threads]") {
  auto dir = kiln::test::temp_dir("hard-threads");
  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\nthreads = 100000\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n"
                                  << "[train]\nprogress = \"none\"\noutput_dir = \"" << (dir / "out").string() << "\"\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], examples = 8}]\n";
  auto r = kiln::test::run_app("train " + (dir / "run.toml").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("threads = 100000") && Catch::Contains("at most"));
  CHECK_THAT(r.output, !Catch::Contains("terminate"));
}

TEST_CASE("a missing data file is a runtime error naming the file", "[e2e]") {
  auto dir = kiln::test::temp_dir("nodata");
  auto text = mlp_config((dir / "out").string());
  text.replace(text.find("train-images-idx3-ubyte.gz"), 26, "no-such-images.gz");
  auto r = kiln::test::run_app("train " + write(dir, "run.toml", text));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Catch::Contains("no-such-images.gz"));
}

TEST_CASE("kiln --version, --help, plugins and devices answer", "[e2e]") {
  auto r = kiln::test::run_app("--version");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("plugin API"));
  for (const char* sub : {"train", "plan", "devices", "plugins", "conformance"}) {
    r = kiln::test::run_app(std::string(sub) + " --help");
    INFO(sub);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("Usage"));
  }
  r = kiln::test::run_app("plugins");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("backend cpu"));
  CHECK_THAT(r.output, Catch::Contains("stage idx"));
  r = kiln::test::run_app("devices --backend cpu");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("cpu:0"));
}

TEST_CASE("kiln plugins and kiln train list a null-entry plugin as failed instead of crashing",
          "[hardening][plugins]") {
  auto r = kiln::test::run_app(std::string("--plugin-dir ") + KILN_TEST_PLUGIN_DIR + " plugins");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("FAILED " + std::string(KILN_TEST_PLUGIN_DIR) + "/libkiln_null_entry.so") &&
                           Catch::Contains("null pointer"));

  auto dir = kiln::test::temp_dir("hard-null-plugin");
  std::ofstream(dir / "run.toml") << "[plugins]\nload = [\"" << KILN_TEST_PLUGIN_DIR << "/libkiln_null_entry.so\"]\n"
                                  << "[model]\ninput_shape = [4]\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n";
  auto t = kiln::test::run_app("train " + (dir / "run.toml").string());
  INFO(t.output);
  CHECK(t.exit_code == 2);
  CHECK_THAT(t.output, Catch::Contains("plugin error") && Catch::Contains("libkiln_null_entry.so"));
}

TEST_CASE("device prefetch changes no value: the same losses and accuracy with it on and off", "[e2e][prefetch]") {
  auto dir = kiln::test::temp_dir("devprefetch");
  // 1000 examples at batch 32: 31 full batches and one of 8, whose upload must not disturb the batch before it.
  auto on = write(dir, "on.toml", mlp_config((dir / "on").string(), "", 1000));
  auto off = write(dir, "off.toml", mlp_config((dir / "off").string(), "device_prefetch = false\n", 1000));
  auto r1 = kiln::test::run_app("train " + on + " --set train.epochs=2");
  auto r2 = kiln::test::run_app("train " + off + " --set train.epochs=2");
  INFO(r1.output << r2.output);
  REQUIRE(r1.exit_code == 0);
  REQUIRE(r2.exit_code == 0);
  auto m1 = lines_of((dir / "on" / "metrics.jsonl").string()), m2 = lines_of((dir / "off" / "metrics.jsonl").string());
  REQUIRE(m1.size() == 2);
  REQUIRE(m2.size() == 2);
  for (size_t e = 0; e < 2; ++e)
    for (const char* k : {"train_loss", "test_loss", "test_accuracy"}) {
      INFO("epoch " << e + 1 << " " << k);
      CHECK(json_field(m1[e], k) == json_field(m2[e], k));
    }
  auto bad = kiln::test::run_app("train " + on + " --set train.device_prefetch=\\\"yes\\\"");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Contains("device_prefetch"));
}

TEST_CASE("[log] every_steps writes step records whose losses make up the epoch's train loss", "[e2e][log]") {
  auto dir = kiln::test::temp_dir("steplog");
  // 1000 examples at batch 32: 31 batches of 32 and one of 8 per epoch.
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 1000) + "[log]\nevery_steps = 1\n");
  auto r = kiln::test::run_app("train " + cfg + " --set train.epochs=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto lines = lines_of((dir / "out" / "metrics.jsonl").string());
  REQUIRE(lines.size() == 2 * 32 + 2);
  double weighted = 0;
  for (int i = 0; i < 32; ++i) {
    const std::string& l = lines[static_cast<size_t>(i)];
    REQUIRE_THAT(l, Catch::StartsWith("{\"event\":\"step\",\"epoch\":1,"));
    CHECK(json_field(l, "step") == i + 1);
    CHECK(json_field(l, "learning_rate") == Approx(2e-3));
    CHECK(json_field(l, "device_memory_in_use") > 0);
    weighted += json_field(l, "loss") * (i < 31 ? 32 : 8);
  }
  REQUIRE_THAT(lines[32], Catch::StartsWith("{\"event\":\"epoch\",\"epoch\":1,"));
  CHECK(weighted / 1000 == Approx(json_field(lines[32], "train_loss")).epsilon(1e-5));
  CHECK(json_field(lines[33], "step") == 33);  // steps count on across epochs

  auto every5 = write(dir, "every5.toml", mlp_config((dir / "out5").string(), "", 1000) + "[log]\nevery_steps = 5\n");
  REQUIRE(kiln::test::run_app("train " + every5 + " --set train.epochs=1").exit_code == 0);
  CHECK(lines_of((dir / "out5" / "metrics.jsonl").string()).size() == 6 + 1);  // steps 5, 10, ..., 30 and the epoch
  auto bad = write(dir, "bad.toml", mlp_config((dir / "bad").string(), "", 1000) + "[log]\nevery_steps = -1\n");
  r = kiln::test::run_app("train " + bad);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("every_steps") && Catch::Contains("bad.toml"));
}

TEST_CASE("progress lines show an ETA and never print the epoch's last batch twice", "[hardening][progress]") {
  auto dir = kiln::test::temp_dir("hard-progress");
  std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\n"
                                  << "[model]\ninput_shape = [8]\n[[model.layers]]\ntype = \"dense\"\nunits = 10\n"
                                  << "[train]\nepochs = 1\nbatch_size = 4\nprogress = \"lines\"\nevaluate = false\n"
                                  << "output_dir = \"" << (dir / "out").string() << "\"\n"
                                  << "[data.train]\nstages = [{type = \"synthetic\", shape = [8], examples = 40}]\n";
  auto r = kiln::test::run_app("train " + (dir / "run.toml").string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // 10 batches, a line every batch: batch 10/10 once, earlier lines with an ETA.
  size_t last = 0, pos = 0;
  while ((pos = r.output.find("batch 10/10", pos)) != std::string::npos) ++last, ++pos;
  CHECK(last == 1);
  CHECK_THAT(r.output, Catch::Contains("batch 5/10") && Catch::Contains(" eta "));
}

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
}  // namespace

TEST_CASE("a run directory is never overwritten silently: --resume, --overwrite, and what each says", "[e2e][rundir]") {
  auto dir = kiln::test::temp_dir("rundir");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 300));
  auto first = kiln::test::run_app("train " + cfg + " --set train.epochs=1");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto ckpt = dir / "out" / "checkpoint.kiln";
  const std::string ckpt_bytes = slurp(ckpt), metrics_bytes = slurp(dir / "out" / "metrics.jsonl");
  REQUIRE(!ckpt_bytes.empty());

  // The run directory says what ran: the resolved config (with --set applied) and run.json.
  CHECK_THAT(slurp(dir / "out" / "config.toml"), Catch::Contains("epochs = 1"));
  const std::string run_json = slurp(dir / "out" / "run.json");
  CHECK_THAT(run_json, Catch::Contains("\"kiln_version\":") && Catch::Contains("\"device\":\"cpu:0\"") &&
                           Catch::Contains("--set train.epochs=1") && Catch::Contains("\"plugins\":[\"cpu "));

  auto again = kiln::test::run_app("train " + cfg + " --set train.epochs=1");
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output,
             Catch::Contains("already holds a run") && Catch::Contains("--resume") && Catch::Contains("--overwrite"));
  CHECK(slurp(ckpt) == ckpt_bytes);  // nothing of the earlier run was touched
  CHECK(slurp(dir / "out" / "metrics.jsonl") == metrics_bytes);

  auto both = kiln::test::run_app("train " + cfg + " --resume --overwrite");
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.output, Catch::Contains("not both"));

  auto over = kiln::test::run_app("train " + cfg + " --set train.epochs=1 --overwrite");
  INFO(over.output);
  CHECK(over.exit_code == 0);
  CHECK_THAT(over.output, Catch::Contains("overwriting the earlier run"));
  CHECK(lines_of((dir / "out" / "metrics.jsonl").string()).size() == 1);

  auto fresh = write(dir, "fresh.toml", mlp_config((dir / "fresh").string(), "", 300));
  auto nothing = kiln::test::run_app("train " + fresh + " --set train.epochs=1 --resume");
  CHECK(nothing.exit_code == 0);
  CHECK_THAT(nothing.output, Catch::Contains("nothing to resume") && Catch::Contains("starting a new run"));
}

TEST_CASE("a run name that is not one directory name is a config error and nothing is written outside runs/",
          "[hardening][paths]") {
  auto dir = kiln::test::temp_dir("hard-paths-name");
  const fs::path escape = dir / "escaped";
  for (const std::string name : {"../escaped", ".", "..", "", "a/b"}) {
    INFO("name = \"" << name << "\"");
    const std::string cfg = write_run(dir, "name = \"" + name + "\"", "");
    // Run from `dir`: the default output runs/<name> is relative, so "../escaped" would land in dir/escaped and
    // "." in dir/runs itself.
    const std::string cmd = "cd " + dir.string() + " && " + std::string(KILN_APP) + " train " + cfg + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    INFO(out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK_THAT(out, Catch::Contains("run.name") && Catch::Contains("one directory name"));
    CHECK_FALSE(fs::exists(dir / "runs" / "metrics.jsonl"));
    CHECK_FALSE(fs::exists(escape));
  }
}

TEST_CASE("an output directory that is a file is a config error naming the key and the path", "[hardening][paths]") {
  auto dir = kiln::test::temp_dir("hard-paths-outfile");
  const fs::path file = dir / "not_a_dir";
  std::ofstream(file) << "keep me\n";
  auto r = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + file.string() + "\""));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("train.output_dir") && Catch::Contains(file.string()) &&
                           Catch::Contains("not a directory"));
  CHECK_THAT(r.output, !Catch::Contains("internal error"));
  std::ifstream f(file);
  std::string line;
  std::getline(f, line);
  CHECK(line == "keep me");

  // A file in the middle of the path: a runtime error naming the key and the path, not "filesystem error".
  auto r2 = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + (file / "sub").string() + "\""));
  INFO(r2.output);
  CHECK(r2.exit_code != 0);
  CHECK_THAT(r2.output, Catch::Contains("train.output_dir") && Catch::Contains((file / "sub").string()));
  CHECK_THAT(r2.output, !Catch::Contains("internal error"));

  // An explicitly empty output_dir is refused too; a valid one trains.
  auto r3 = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"\""));
  CHECK(r3.exit_code == 2);
  CHECK_THAT(r3.output, Catch::Contains("train.output_dir") && Catch::Contains("is empty"));
  auto ok = kiln::test::run_app("train " + write_run(dir, "", "output_dir = \"" + (dir / "out").string() + "\""));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK(fs::exists(dir / "out" / "metrics.jsonl"));
}

TEST_CASE("after a resume metrics.jsonl holds each epoch once, even when records were written after the checkpoint",
          "[e2e][rundir]") {
  auto dir = kiln::test::temp_dir("trim");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 300));
  REQUIRE(kiln::test::run_app("train " + cfg + " --set train.epochs=1").exit_code == 0);
  // What a run killed after writing a record but before its next checkpoint leaves: a later record and a cut line.
  {
    std::ofstream m(dir / "out" / "metrics.jsonl", std::ios::app);
    m << "{\"event\":\"epoch\",\"epoch\":2,\"step\":20,\"train_loss\":0.5}\n{\"event\":\"step\",\"epo";
  }
  auto r = kiln::test::run_app("train " + cfg + " --set train.epochs=2 --resume");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("dropped 2 record(s)"));
  auto lines = lines_of((dir / "out" / "metrics.jsonl").string());
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Catch::Contains("\"epoch\":1,"));
  CHECK_THAT(lines[1], Catch::Contains("\"epoch\":2,"));
  CHECK(json_field(lines[1], "step") == 20);  // 300 examples at batch 32: 10 steps per epoch
  CHECK_THAT(slurp(dir / "out" / "run.json"), Catch::Contains("\"resumed_at_step\":10"));
}

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

TEST_CASE("a run belongs to one process: a second kiln train of a locked run is refused naming the holder",
          "[e2e][rundir]") {
  auto dir = kiln::test::temp_dir("lock");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 300));
  std::filesystem::create_directories(dir / "out");
  // This test process plays the running holder: it takes the lock as kiln train does and writes its line.
  const std::string lock = (dir / "out" / ".kiln.lock").string();
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string who = "pid " + std::to_string(::getpid()) + "\nstarted now\ncommand kiln train run.toml\n";
  REQUIRE(::write(fd, who.data(), who.size()) == static_cast<ssize_t>(who.size()));
  auto r = kiln::test::run_app("train " + cfg + " --set train.epochs=1");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output,
             Catch::Contains("in use by another kiln process") && Catch::Contains("pid " + std::to_string(::getpid())));
  CHECK_FALSE(std::filesystem::exists(dir / "out" / "metrics.jsonl"));
  ::close(fd);  // the holder ends: the run is free again
  auto after = kiln::test::run_app("train " + cfg + " --set train.epochs=1");
  INFO(after.output);
  CHECK(after.exit_code == 0);
}

namespace {
// The numbers of each epoch record (losses, accuracy), without its timings.
std::vector<std::string> epoch_values(const std::string& metrics_path) {
  std::vector<std::string> v;
  std::regex re("\"(train_loss|test_loss|test_accuracy|step)\":([-0-9.eE+]+|null)");
  for (const auto& l : lines_of(metrics_path)) {
    if (l.find("\"event\":\"epoch\"") == std::string::npos) continue;
    std::string s;
    for (auto it = std::sregex_iterator(l.begin(), l.end(), re); it != std::sregex_iterator(); ++it)
      s += (*it)[0].str() + " ";
    v.push_back(s);
  }
  return v;
}
}  // namespace

TEST_CASE("a run stopped mid-epoch (max_steps) and resumed ends bit-identical to an uninterrupted run",
          "[e2e][resume]") {
  auto dir = kiln::test::temp_dir("midepoch");
  // 1000 examples at batch 32 (32 steps per epoch, the last of 8), shuffled: the position inside the epoch matters.
  auto cfg = write(dir, "run.toml", mlp_config((dir / "full").string(), "", 1000));
  REQUIRE(kiln::test::run_app("train " + cfg + " --set train.epochs=2").exit_code == 0);
  const std::string full = slurp(dir / "full" / "checkpoint.kiln");
  REQUIRE(!full.empty());
  for (int stop_at : {13, 45}) {  // inside epoch 1; inside epoch 2
    CAPTURE(stop_at);
    const std::string out = (dir / ("cut" + std::to_string(stop_at))).string();
    const std::string set_out = " --set train.epochs=2 --set 'train.output_dir=\"" + out + "\"'";
    auto cut = kiln::test::run_app("train " + cfg + set_out + " --set train.max_steps=" + std::to_string(stop_at));
    INFO(cut.output);
    REQUIRE(cut.exit_code == 0);
    CHECK_THAT(cut.output,
               Catch::Contains("stopped at max_steps = " + std::to_string(stop_at)) && Catch::Contains("--resume"));
    auto rest = kiln::test::run_app("train " + cfg + set_out + " --resume");
    INFO(rest.output);
    REQUIRE(rest.exit_code == 0);
    CHECK_THAT(rest.output, Catch::Contains("mid-epoch"));
    // The same weights, optimizer state and EMA, bit for bit, and the same epoch losses and accuracy.
    CHECK(slurp(std::filesystem::path(out) / "checkpoint.kiln") == full);
    CHECK(epoch_values(out + "/metrics.jsonl") == epoch_values((dir / "full" / "metrics.jsonl").string()));
  }
}

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

TEST_CASE("SIGTERM finishes the step, writes a checkpoint, exits 143, and the resumed run ends as an uninterrupted one",
          "[e2e][resume][signals]") {
  auto dir = kiln::test::temp_dir("sigterm");
  // Long enough (6000 examples x 3 epochs, a wider layer) that the signal lands mid-run; step records show progress.
  std::string cfg_text = mlp_config((dir / "run").string(), "", 6000) + "[log]\nevery_steps = 1\n";
  cfg_text = std::regex_replace(cfg_text, std::regex("units = 64"), "units = 512");
  auto cfg = write(dir, "run.toml", cfg_text);
  REQUIRE(
      kiln::test::run_app("train " + cfg + " --set 'train.output_dir=\"" + (dir / "full").string() + "\"'").exit_code ==
      0);

  const std::string log = (dir / "cut.log").string();
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string cmd = "exec " + std::string(KILN_APP) + " train " + cfg + " > " + log + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait (at most 60 s) until a few steps are done, then ask the run to stop.
  const auto metrics = (dir / "run" / "metrics.jsonl").string();
  for (int i = 0; i < 6000 && lines_of(metrics).size() < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string out = slurp(log);
  INFO(out);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 143);
  CHECK_THAT(out, Catch::Contains("stopped by SIGTERM after") && Catch::Contains("checkpoint written to") &&
                      Catch::Contains("--resume"));
  auto rest = kiln::test::run_app("train " + cfg + " --resume");
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(slurp(dir / "run" / "checkpoint.kiln") == slurp(dir / "full" / "checkpoint.kiln"));
  // Every step record once, in order, after the kill and the resume.
  int64_t expect = 1;
  for (const auto& l : lines_of(metrics))
    if (l.find("\"event\":\"step\"") != std::string::npos) CHECK(json_field(l, "step") == expect++);
  CHECK(expect - 1 == 3 * 188);  // 6000 examples at batch 32: 188 steps per epoch
}

TEST_CASE("a resume with a changed model or optimizer is refused with the differing keys while epochs may change",
          "[e2e][resume]") {
  auto dir = kiln::test::temp_dir("cfgdiff");
  auto cfg = write(dir, "run.toml", mlp_config((dir / "out").string(), "", 300));
  REQUIRE(kiln::test::run_app("train " + cfg + " --set train.epochs=1").exit_code == 0);
  const std::string ckpt = slurp(dir / "out" / "checkpoint.kiln");
  auto r = kiln::test::run_app("train " + cfg +
                               " --resume --set train.epochs=2 --set optimizer.learning_rate=0.01 "
                               "--set model.layers[1].units=32");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("cannot resume") && Catch::Contains("optimizer.learning_rate: 0.002 -> 0.01") &&
                           Catch::Contains("model.layers[1].units: 64 -> 32") && Catch::Contains("--overwrite"));
  CHECK_FALSE(Catch::Contains("train.epochs").match(r.output));
  CHECK(slurp(dir / "out" / "checkpoint.kiln") == ckpt);
  auto ok = kiln::test::run_app("train " + cfg + " --resume --set train.epochs=2 --set 'train.progress=\"none\"'");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("kill -9 at several points with a --resume after each ends bit-identical to an uninterrupted run",
          "[e2e][resume][signals]") {
  auto dir = kiln::test::temp_dir("kill9");
  // Checkpoints every 7 steps; step records show how far a run got. 6000 examples x 2 epochs, 188 steps each.
  std::string cfg_text =
      mlp_config((dir / "run").string(), "checkpoint_every_steps = 7\n", 6000) + "[log]\nevery_steps = 1\n";
  cfg_text = std::regex_replace(cfg_text, std::regex("epochs = 3"), "epochs = 2");
  cfg_text = std::regex_replace(cfg_text, std::regex("units = 64"), "units = 512");
  auto cfg = write(dir, "run.toml", cfg_text);
  REQUIRE(
      kiln::test::run_app("train " + cfg + " --set 'train.output_dir=\"" + (dir / "full").string() + "\"'").exit_code ==
      0);
  const auto metrics = (dir / "run" / "metrics.jsonl").string();
  // Kill points: after this many more step records (some land during a checkpoint write, some between two).
  int kills = 0;
  for (size_t more : {23u, 61u, 140u}) {
    const size_t before = lines_of(metrics).size();
    const std::string log = (dir / ("kill" + std::to_string(kills) + ".log")).string();
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const std::string cmd = "exec " + std::string(KILN_APP) + " train " + cfg + " --resume > " + log + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 6000 && lines_of(metrics).size() < before + more; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    INFO(slurp(log));
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));  // it was still running: a real mid-run kill
    ++kills;
  }
  auto rest = kiln::test::run_app("train " + cfg + " --resume");
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(slurp(dir / "run" / "checkpoint.kiln") == slurp(dir / "full" / "checkpoint.kiln"));
  int64_t expect = 1;
  for (const auto& l : lines_of(metrics))
    if (l.find("\"event\":\"step\"") != std::string::npos) CHECK(json_field(l, "step") == expect++);
  CHECK(expect - 1 == 2 * 188);
}
