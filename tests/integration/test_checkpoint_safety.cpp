// Checkpoints that survive damage and kills, and a run that belongs to one process: the real `kiln` app on a
// Fashion-MNIST subset (keep_checkpoints and the fallback, a kill -9 inside a checkpoint write, two
// concurrent runs of one name).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

// An MLP on `limit` training examples (batch 32), one epoch unless --set says otherwise, output in `out`.
std::string config(const fs::path& out, const std::string& extra_train, int limit, int units, int epochs = 1) {
  std::ostringstream os;
  os << R"([run]
name = "ckpt"
seed = 5
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
units = )"
     << units << R"(
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[optimizer]
type = "adam"
learning_rate = 2e-3
[train]
epochs = )"
     << epochs << R"(
batch_size = 32
progress = "none"
output_dir = ")"
     << out.string() << "\"\n"
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
     << kFm << R"(t10k-images-idx3-ubyte.gz", labels = ")" << kFm << R"(t10k-labels-idx1-ubyte.gz", limit = 500 },
  { type = "scale", factor = 0.00392156862745098 },
  { type = "batch" },
]
)";
  return os.str();
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::set<std::string> kiln_files(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".kiln") s.insert(e.path().filename().string());
  return s;
}

// The "step" of every step record of metrics.jsonl, in order.
std::vector<int64_t> step_records(const fs::path& metrics) {
  std::ifstream f(metrics);
  std::vector<int64_t> v;
  static const std::regex re("\"event\":\"step\",\"epoch\":[0-9]+,\"step\":([0-9]+)");
  for (std::string l; std::getline(f, l);) {
    std::smatch m;
    if (std::regex_search(l, m, re)) v.push_back(std::stoll(m[1]));
  }
  return v;
}

// Starts `kiln ARGS` in the background (its output to `log`), with `env` ("NAME=value ...") in front; returns its pid.
pid_t spawn(const std::string& args, const std::string& log, const std::string& env = "") {
  const std::string cmd = "exec env " + env + " " + std::string(KILN_APP) + " " + args + " > " + log + " 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("keep_checkpoints keeps the newest K and a damaged newest falls back to the one before, naming both",
          "[e2e][resume][checkpoint]") {
  auto dir = kiln::test::temp_dir("keepk");
  // 1500 examples at batch 32: 47 steps an epoch; two epochs; a checkpoint every 10 steps and at each epoch's end.
  auto cfg =
      write(dir / "run.toml", config(dir / "run", "checkpoint_every_steps = 10\nkeep_checkpoints = 3\n", 1500, 64, 2) +
                                  "[log]\nevery_steps = 1\n");
  const std::string full_dir = "--set 'train.output_dir=\"" + (dir / "full").string() + "\"'";
  auto full = kiln::test::run_app("train " + cfg + " " + full_dir);
  INFO(full.output);
  REQUIRE(full.exit_code == 0);
  // Steps 10..90 and the epoch ends 47 and 94: the newest three stay.
  CHECK(kiln_files(dir / "full") ==
        std::set<std::string>{"checkpoint.kiln", "checkpoint-step90.kiln", "checkpoint-step80.kiln"});
  CHECK(kiln::load_checkpoint((dir / "full" / "checkpoint-step80.kiln").string()).step == 80);

  auto first = kiln::test::run_app("train " + cfg + " --set train.max_steps=60");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const fs::path run = dir / "run";
  CHECK(kiln_files(run) ==
        std::set<std::string>{"checkpoint.kiln", "checkpoint-step50.kiln", "checkpoint-step47.kiln"});

  // Truncated newest: the resume takes step 50's and says so.
  fs::resize_file(run / "checkpoint.kiln", fs::file_size(run / "checkpoint.kiln") / 2);
  auto second = kiln::test::run_app("train " + cfg + " --resume --set train.max_steps=80");
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, Catch::Contains("warning: " + (run / "checkpoint.kiln").string() + " is damaged") &&
                                Catch::Contains("checksum mismatch") &&
                                Catch::Contains("resuming from the checkpoint before it, " +
                                                (run / "checkpoint-step50.kiln").string()));
  CHECK(fs::exists(run / "checkpoint.kiln.damaged"));

  // One flipped byte in the newest (step 80, inside a tensor): the resume takes step 70's.
  {
    std::fstream f(run / "checkpoint.kiln", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(run / "checkpoint.kiln") / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(fs::file_size(run / "checkpoint.kiln") / 2));
    f.write(&c, 1);
  }
  auto third = kiln::test::run_app("train " + cfg + " --resume");
  INFO(third.output);
  REQUIRE(third.exit_code == 0);
  CHECK_THAT(third.output,
             Catch::Contains("resuming from the checkpoint before it, " + (run / "checkpoint-step70.kiln").string()));
  // Resumed twice from earlier checkpoints, the run still ends exactly where the uninterrupted one did, with every
  // step recorded once.
  CHECK(slurp(run / "checkpoint.kiln") == slurp(dir / "full" / "checkpoint.kiln"));
  std::vector<int64_t> expect(94);
  for (int64_t i = 0; i < 94; ++i) expect[static_cast<size_t>(i)] = i + 1;
  CHECK(step_records(run / "metrics.jsonl") == expect);
  CHECK(kiln_files(run).count("checkpoint-step90.kiln") == 1);
  CHECK(kiln_files(run).count("checkpoint-step50.kiln") == 0);  // pruned: only the newest three stay

  // With nothing left to fall back to, the resume refuses and lists each file's fault.
  auto lone = dir / "lone";
  auto cfg1 = write(dir / "lone.toml", config(lone, "", 300, 16));
  REQUIRE(kiln::test::run_app("train " + cfg1).exit_code == 0);
  CHECK(kiln_files(lone) == std::set<std::string>{"checkpoint.kiln"});  // the default keeps one
  fs::resize_file(lone / "checkpoint.kiln", 100);
  auto none = kiln::test::run_app("train " + cfg1 + " --resume");
  INFO(none.output);
  CHECK(none.exit_code != 0);
  CHECK_THAT(none.output, Catch::Contains("no checkpoint of this run can be loaded") &&
                              Catch::Contains((lone / "checkpoint.kiln").string() + ": checkpoint checksum mismatch"));
}

TEST_CASE("kill -9 aimed inside a checkpoint write leaves the previous checkpoint and the resume ends bit-identical",
          "[e2e][resume][signals][checkpoint]") {
  auto dir = kiln::test::temp_dir("kill9write");
  // 512 hidden units: a 4.9 MB checkpoint (weights and Adam moments), written in 64 KiB chunks with a pause after each
  // (KILN_TEST_CHECKPOINT_WRITE_PAUSE_MS), so the write lasts long enough to be killed in the middle.
  auto cfg = write(dir / "run.toml", config(dir / "run", "checkpoint_every_steps = 20\n", 3000, 512));
  REQUIRE(
      kiln::test::run_app("train " + cfg + " --set 'train.output_dir=\"" + (dir / "full").string() + "\"'").exit_code ==
      0);

  const fs::path run = dir / "run";
  const std::string log = (dir / "killed.log").string();
  const pid_t pid = spawn("train " + cfg, log, "KILN_TEST_CHECKPOINT_WRITE_PAUSE_MS=20");
  REQUIRE(pid > 0);
  // The second checkpoint (step 40) is half written when checkpoint.kiln (step 20) exists and the temporary holds 1
  // MiB.
  const fs::path tmp = run / ("checkpoint.kiln.tmp." + std::to_string(pid));
  bool inside = false;
  for (int i = 0; i < 20000 && !inside; ++i) {
    std::error_code ec;
    inside =
        fs::exists(run / "checkpoint.kiln", ec) && fs::exists(tmp, ec) && fs::file_size(tmp, ec) >= (1u << 20) && !ec;
    if (!inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  const int code = wait_exit(pid);
  INFO(slurp(log));
  REQUIRE(inside);
  CHECK(code == 128 + SIGKILL);  // killed, not finished
  std::error_code ec;
  CHECK(fs::file_size(tmp, ec) < fs::file_size(run / "checkpoint.kiln"));  // the new checkpoint was cut short
  CHECK_FALSE(ec);
  CHECK(kiln::load_checkpoint((run / "checkpoint.kiln").string()).step == 20);  // the previous one is whole

  auto rest = kiln::test::run_app("train " + cfg + " --resume");
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK_THAT(rest.output,
             Catch::Contains("resumed from " + (run / "checkpoint.kiln").string() + " at epoch 1, step 20"));
  CHECK(slurp(run / "checkpoint.kiln") == slurp(dir / "full" / "checkpoint.kiln"));
  CHECK_FALSE(fs::exists(tmp));  // the killed writer's temporary is removed by the next holder of the run
}

TEST_CASE(
    "two kiln train of one run started at once: one trains, the other refuses naming its pid, the first is intact",
    "[e2e][lock][checkpoint]") {
  auto dir = kiln::test::temp_dir("race");
  auto cfg = write(dir / "run.toml", config(dir / "race", "", 3000, 64, 3) + "[log]\nevery_steps = 10\n");
  auto solo = kiln::test::run_app("train " + cfg + " --set 'train.output_dir=\"" + (dir / "solo").string() + "\"'");
  REQUIRE(solo.exit_code == 0);

  const std::string log_a = (dir / "a.log").string(), log_b = (dir / "b.log").string();
  // Slow checkpoint writes (the same bytes) keep the first one running well past the moment the second takes the
  // lock, even on a loaded machine: the second must meet a live holder, not a finished run.
  const std::string slow = "KILN_TEST_CHECKPOINT_WRITE_PAUSE_MS=60";
  const pid_t a = spawn("train " + cfg, log_a, slow), b = spawn("train " + cfg, log_b, slow);
  REQUIRE(a > 0);
  REQUIRE(b > 0);
  const int code_a = wait_exit(a), code_b = wait_exit(b);
  const std::string out_a = slurp(log_a), out_b = slurp(log_b);
  INFO("first: exit " << code_a << "\n" << out_a << "\nsecond: exit " << code_b << "\n" << out_b);
  REQUIRE(((code_a == 0) != (code_b == 0)));  // exactly one proceeds
  const pid_t winner = code_a == 0 ? a : b;
  const std::string& refused = code_a == 0 ? out_b : out_a;
  CHECK_THAT(refused,
             Catch::Contains("this run is in use by another kiln process (pid " + std::to_string(winner) + "\n") ||
                 Catch::Contains("this run is in use by another kiln process (pid " + std::to_string(winner) + ","));
  // Nothing of the first is damaged: its checkpoint and records are a solo run's.
  CHECK(slurp(dir / "race" / "checkpoint.kiln") == slurp(dir / "solo" / "checkpoint.kiln"));
  CHECK(step_records(dir / "race" / "metrics.jsonl") == step_records(dir / "solo" / "metrics.jsonl"));
  CHECK(step_records(dir / "race" / "metrics.jsonl").size() == 28);  // 282 steps, a record every 10
}

TEST_CASE("a version-1 checkpoint (KILNCKP1, FNV-1a) still loads and a version-2 one is checked with XXH3-64",
          "[checkpoint]") {
  auto dir = kiln::test::temp_dir("ckptv1");
  kiln::Checkpoint c;
  c.epoch = 3;
  c.step = 77;
  c.data_state = {1, 2, 3};
  c.tensors.emplace("w", kiln::HostTensor(kiln::Shape{3, 5}, 0.75f));
  const std::string v2 = (dir / "v2.kiln").string();
  kiln::save_checkpoint(v2, c);
  std::string bytes = slurp(v2);
  REQUIRE(bytes.substr(0, 8) == "KILNCKP2");
  // The same content as version 1: the old magic and an FNV-1a 64 checksum, as Kiln wrote it before.
  std::string v1 = bytes.substr(0, bytes.size() - 8);
  v1.replace(0, 8, "KILNCKP1");
  uint64_t h = 1469598103934665603ull;
  for (char ch : v1) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  v1.append(reinterpret_cast<const char*>(&h), 8);
  std::ofstream(dir / "v1.kiln", std::ios::binary) << v1;
  auto back = kiln::load_checkpoint((dir / "v1.kiln").string());
  CHECK(back.step == 77);
  CHECK(back.data_state == c.data_state);
  CHECK(back.tensors.at("w").data == c.tensors.at("w").data);
  // A version-2 file with a version-1 checksum is damaged, not accepted.
  std::string mixed = v1;
  mixed.replace(0, 8, "KILNCKP2");
  std::ofstream(dir / "mixed.kiln", std::ios::binary) << mixed;
  CHECK_THROWS_WITH(kiln::load_checkpoint((dir / "mixed.kiln").string()), Catch::Contains("checksum mismatch"));
}
