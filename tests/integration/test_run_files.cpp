// What a command writes never destroys what it reads, what it reads is a regular file, and a resumed run refuses
// state that does not match it: the real `kiln` app on small Fashion-MNIST and tiny Shakespeare runs.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kFm = "/usr/share/datasets/fashion-mnist/";

// A small MLP (or, with hidden = 0, a linear model) on 640 Fashion-MNIST images, 20 steps an epoch.
std::string mlp(const fs::path& out, const std::string& extra = {}, int hidden = 16) {
  std::ostringstream os;
  os << "[run]\nname = \"files\"\nseed = 5\n[device]\nbackend = \"cpu\"\n[model]\ninput_shape = [1, 28, 28]\n"
     << "loss = \"softmax_cross_entropy\"\n[[model.layers]]\ntype = \"flatten\"\n";
  if (hidden > 0) os << "[[model.layers]]\ntype = \"dense\"\nunits = " << hidden << "\nactivation = \"relu\"\n";
  os << "[[model.layers]]\ntype = \"dense\"\nunits = 10\n[optimizer]\ntype = \"sgd\"\nlearning_rate = 0.05\n"
     << "[train]\nepochs = 2\nbatch_size = 32\nprogress = \"none\"\noutput_dir = \"" << out.string() << "\"\n"
     << "[data.train]\nstages = [\n  { type = \"idx\", images = \"" << kFm
     << "train-images-idx3-ubyte.gz\", labels = \"" << kFm
     << "train-labels-idx1-ubyte.gz\", limit = 640 },\n  { type = \"scale\", factor = 0.00392156862745098 },\n"
     << "  { type = \"batch\" },\n]\n[data.test]\nstages = [\n  { type = \"idx\", images = \"" << kFm
     << "t10k-images-idx3-ubyte.gz\", labels = \"" << kFm << "t10k-labels-idx1-ubyte.gz\", limit = 200 },\n"
     << "  { type = \"scale\", factor = 0.00392156862745098 },\n  { type = \"batch\" },\n]\n"
     << extra;
  return os.str();
}

fs::path write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

kiln::test::AppResult app(const std::string& args) {
  auto r = kiln::test::run_app(args);
  UNSCOPED_INFO("kiln " << args << "\n" << r.output);
  return r;
}

// The app under `timeout`: a command that would hang (reading a FIFO) is killed after 20 s and fails the test.
kiln::test::AppResult app_bounded(const std::string& args) {
  auto r = kiln::test::run_shell(std::string("timeout -s KILL 20 ") + KILN_APP + " " + args);
  UNSCOPED_INFO("kiln " << args << "\n" << r.output);
  return r;
}

// A trained run: its config and output directory.
struct Trained {
  fs::path dir, cfg, out;
};
Trained trained(const std::string& tag, const std::string& extra = {}) {
  Trained t;
  t.dir = kiln::test::temp_dir(tag);
  t.out = t.dir / "run";
  t.cfg = write(t.dir / "mlp.toml", mlp(t.out, extra));
  auto r = app("train " + t.cfg.string());
  REQUIRE(r.exit_code == 0);
  return t;
}

}  // namespace

TEST_CASE("export and predict refuse an output that is an input or a file of the run", "[files][export]") {
  const Trained t = trained("files_outputs");
  const fs::path ckpt = t.out / "checkpoint.kiln";
  const std::string before = slurp(ckpt), cfg_before = slurp(t.cfg);

  auto r = app("export " + t.cfg.string() + " --format safetensors --overwrite --output " + ckpt.string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("is a file of the run in") != std::string::npos);

  r = app("export " + t.cfg.string() + " --format safetensors --overwrite --output " + t.cfg.string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("the config file, which this command reads") != std::string::npos);

  // Through a symbolic link to the checkpoint given with --checkpoint, and through a hard link to it.
  const fs::path copy = t.dir / "copy.kiln", link = t.dir / "link.kiln", hard = t.dir / "hard.kiln";
  fs::copy_file(ckpt, copy);
  fs::create_symlink(copy, link);
  fs::create_hard_link(copy, hard);
  for (const fs::path& out : {link, hard}) {
    r = app("export " + t.cfg.string() + " --format safetensors --overwrite --checkpoint " + copy.string() +
            " --output " + out.string());
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("the same file as " + copy.string() + " (--checkpoint)") != std::string::npos);
  }
  // Run files by name, in the run directory: the metrics and the run record too.
  for (const char* name : {"metrics.jsonl", "run.json", "config.toml", "vocab.json"}) {
    r = app("export " + t.cfg.string() + " --format safetensors --overwrite --output " + (t.out / name).string());
    CHECK(r.exit_code == 2);
  }
  CHECK(slurp(ckpt) == before);
  CHECK(slurp(t.cfg) == cfg_before);
  CHECK(slurp(copy) == before);

  // An output in a directory that does not exist is a usage error naming it, not "disk full or no permission?".
  r = app("export " + t.cfg.string() + " --format safetensors --output " +
          (t.dir / "nowhere" / "w.safetensors").string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("does not exist; create it first") != std::string::npos);
  // Elsewhere in the run directory a new file is fine.
  r = app("export " + t.cfg.string() + " --format safetensors --output " + (t.out / "weights.safetensors").string());
  CHECK(r.exit_code == 0);
}

TEST_CASE("a checkpoint path that is a directory or a FIFO is refused at once", "[files][checkpoint]") {
  const Trained t = trained("files_fifo");
  const fs::path fifo = t.dir / "fifo.kiln";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  // `timeout`: a hang (reading the FIFO) fails the test instead of stopping the suite.
  for (const std::string& cmd : {std::string("evaluate"), std::string("export --format safetensors --output ") +
                                                              (t.dir / "w.safetensors").string()}) {
    auto r = app(cmd + " " + t.cfg.string() + " --checkpoint " + t.out.string());
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(t.out.string() + ": is a directory; expected a Kiln checkpoint file") != std::string::npos);
    r = app_bounded(cmd + " " + t.cfg.string() + " --checkpoint " + fifo.string());
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("is a FIFO (named pipe), not a regular file") != std::string::npos);
  }
  // A FIFO under the run's checkpoint name is refused on --resume, not moved aside as a damaged checkpoint.
  fs::remove(t.out / "checkpoint.kiln");
  REQUIRE(::mkfifo((t.out / "checkpoint.kiln").c_str(), 0644) == 0);
  auto r = app_bounded("train " + t.cfg.string() + " --resume");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("is a FIFO (named pipe)") != std::string::npos);
  CHECK(fs::is_fifo(t.out / "checkpoint.kiln"));
}

TEST_CASE("run files planted as symbolic links are refused and their targets stay intact", "[files][lock]") {
  const auto dir = kiln::test::temp_dir("files_links");
  const fs::path out = dir / "run", victim = dir / "victim.txt";
  const auto cfg = write(dir / "mlp.toml", mlp(out));
  write(victim, "a user's file\n");
  fs::create_directories(out);
  fs::create_symlink(victim, out / ".kiln.lock");
  auto r = app("train " + cfg.string());
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(".kiln.lock: is a symbolic link") != std::string::npos);
  CHECK(slurp(victim) == "a user's file\n");

  // metrics.jsonl is appended to in place: a link there is refused too (before the run writes anything).
  fs::remove(out / ".kiln.lock");
  fs::create_symlink(victim, out / "metrics.jsonl");
  r = app("train " + cfg.string() + " --overwrite");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("metrics.jsonl: is a symbolic link") != std::string::npos);
  CHECK(slurp(victim) == "a user's file\n");
  CHECK_FALSE(fs::exists(out / "checkpoint.kiln"));
}

TEST_CASE("a run started over keeps no TensorBoard events of the earlier run", "[files][tensorboard]") {
  const Trained t = trained("files_tb", "[log]\ntensorboard = true\n");
  auto events = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(t.out))
      n += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    return n;
  };
  REQUIRE(events() == 1);
  auto r = app("train " + t.cfg.string() + " --overwrite");
  REQUIRE(r.exit_code == 0);
  CHECK(events() == 1);
  // A resumed run adds its own event file beside the earlier one's (the same run, continued).
  r = app("train " + t.cfg.string() + " --resume --set train.epochs=3");
  REQUIRE(r.exit_code == 0);
  CHECK(events() == 2);
}

TEST_CASE("a resume with another optimizer's checkpoint is refused and changes nothing", "[files][resume]") {
  const Trained t = trained("files_resume_opt");
  const std::string metrics = slurp(t.out / "metrics.jsonl"), ckpt = slurp(t.out / "checkpoint.kiln");
  // The checkpoint of an SGD run in an Adam run (the run's config.toml gone, as in a copied checkpoint).
  fs::remove(t.out / "config.toml");
  auto r = app("train " + t.cfg.string() + " --resume --set train.epochs=3 --set optimizer.type=\"adam\"");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("checkpoint.kiln (resuming " + t.cfg.string() + "): the checkpoint does not match this run") !=
        std::string::npos);
  CHECK(r.output.find("/adam_m'") != std::string::npos);
  CHECK(r.output.find("the optimizer state differs") != std::string::npos);
  // Another model's checkpoint: named as such, with the tensor and both shapes.
  r = app("train " + t.cfg.string() + " --resume --set train.epochs=3 --set model.layers[1].units=8");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("it was written by another model") != std::string::npos);
  CHECK(r.output.find("(784, 16) there, (784, 8) in the model") != std::string::npos);
  CHECK(slurp(t.out / "metrics.jsonl") == metrics);
  CHECK(slurp(t.out / "checkpoint.kiln") == ckpt);
}

TEST_CASE("a checkpoint whose header holds an impossible epoch or step is refused", "[files][resume]") {
  const Trained t = trained("files_resume_header");
  const std::string metrics = slurp(t.out / "metrics.jsonl");
  const fs::path ckpt = t.out / "checkpoint.kiln";
  const kiln::Checkpoint good = kiln::load_checkpoint(ckpt.string());
  REQUIRE(good.epoch == 2);
  REQUIRE(good.step == 40);
  struct Bad {
    int64_t epoch, step;
    const char* says;
  };
  for (const Bad& b : {Bad{-1, 40, "neither can be negative"}, Bad{2, -5, "neither can be negative"},
                       Bad{1, 40000, "which this run cannot reach"}, Bad{2, 3, "which this run cannot reach"},
                       Bad{9, 180, "beyond the run's [train] epochs = 3"}}) {
    kiln::Checkpoint c = good;
    c.epoch = b.epoch;
    c.step = b.step;
    kiln::save_checkpoint(ckpt.string(), c);
    auto r = app("train " + t.cfg.string() + " --resume --set train.epochs=3");
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(b.says) != std::string::npos);
    CHECK(slurp(t.out / "metrics.jsonl") == metrics);  // not trimmed to the bad step
  }
}

TEST_CASE("a resume whose text changed its characters is refused and keeps vocab.json", "[files][resume][text]") {
  const auto dir = kiln::test::temp_dir("files_vocab");
  const fs::path text = dir / "input.txt", out = dir / "run";
  write(text, "hello world, a small text of few characters.\nhello again, world.\n");
  std::ostringstream os;
  os << "[run]\nname = \"v\"\n[device]\nbackend = \"cpu\"\n[model]\ninput_shape = [8]\n[[model.layers]]\n"
     << "type = \"embedding\"\nvocab = 40\ndim = 8\n[[model.layers]]\ntype = \"dense\"\nunits = 40\n[optimizer]\n"
     << "type = \"adam\"\nlearning_rate = 1e-2\n[train]\nepochs = 1\nbatch_size = 4\nsteps_per_epoch = 4\n"
     << "progress = \"none\"\nevaluate = false\noutput_dir = \"" << out.string() << "\"\n[data.train]\n"
     << "stages = [{type = \"text\", path = \"" << text.string() << "\", block_size = 8}]\n";
  const auto cfg = write(dir / "text.toml", os.str());
  auto r = app("train " + cfg.string());
  REQUIRE(r.exit_code == 0);
  const std::string vocab = slurp(out / "vocab.json"), metrics = slurp(out / "metrics.jsonl");
  std::ofstream(text, std::ios::app) << "QUITE NEW LETTERS!\n";
  r = app("train " + cfg.string() + " --resume --set train.epochs=2");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("its vocabulary differs from " + (out / "vocab.json").string()) != std::string::npos);
  CHECK(slurp(out / "vocab.json") == vocab);
  CHECK(slurp(out / "metrics.jsonl") == metrics);
}

TEST_CASE("early stopping that restores the best epoch reports that epoch's accuracy as final", "[files][early]") {
  const auto dir = kiln::test::temp_dir("files_early");
  // min_delta = 100: no epoch after the first counts as better, so epoch 1 is the best and its weights return.
  const auto cfg = write(dir / "mlp.toml", mlp(dir / "run", "") + "");
  auto r = app("train " + cfg.string() +
               " --set train.epochs=4 --set 'train.early_stopping={metric=\"test_loss\", min_delta=100, patience=1}'");
  REQUIRE(r.exit_code == 0);
  std::smatch m1, fin;
  REQUIRE(std::regex_search(r.output, m1, std::regex("epoch 1/4: [^\n]*test accuracy ([0-9.]+)")));
  REQUIRE(std::regex_search(r.output, fin, std::regex("final test accuracy ([0-9.]+) \\(epoch 1, restored\\)")));
  const std::string epoch1 = m1[1].str();  // the matches point into r.output, which the next run replaces
  CHECK(fin[1].str() == epoch1);
  // The restored weights are the checkpoint's: evaluating it gives epoch 1's accuracy.
  r = app("evaluate " + cfg.string() + " --data test");
  REQUIRE(r.exit_code == 0);
  std::smatch ev;
  REQUIRE(std::regex_search(r.output, ev, std::regex("accuracy ([0-9.]+)")));
  CHECK(std::stod(ev[1].str()) == Approx(std::stod(epoch1)).margin(1e-4));
  CHECK(slurp(dir / "run" / "metrics.jsonl").find("\"event\":\"restore_best\"") != std::string::npos);
}

TEST_CASE("settings that make a run meaningless are refused before step 1", "[files][settings]") {
  const auto dir = kiln::test::temp_dir("files_settings");
  const auto cfg = write(dir / "mlp.toml", mlp(dir / "run"));
  // 2 epochs of 20 steps: a warmup of 40 steps or more never reaches the learning rate. Said before step 1 (a short
  // trial of a long run's config is common, so not refused).
  auto r = app("train " + cfg.string() + " --set 'optimizer.schedule={warmup_steps=40}'");
  CHECK(r.exit_code == 0);
  const auto warn = r.output.find("warning: ");
  CHECK(warn < r.output.find("epoch 1/2"));
  CHECK(r.output.find("'optimizer.schedule.warmup_steps': 40 warmup steps, but the whole run is 40 steps (2 epoch(s) "
                      "of 20): the learning rate ends at 0.04878") != std::string::npos);
  // max_steps only stops the process early: the schedule spans the epochs, so this warmup draws no warning.
  r = app("train " + cfg.string() +
          " --overwrite --set train.max_steps=10 --set 'optimizer.schedule={warmup_steps=30}'");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("warning") == std::string::npos);
  fs::remove_all(dir / "run");
  r = app("train " + cfg.string() + " --set model.from_logits=false");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("'model.from_logits'") != std::string::npos);
  CHECK(r.output.find("softmax_cross_entropy takes logits") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "run" / "metrics.jsonl"));
  // A run name longer than a directory name can be.
  const auto named = write(dir / "named.toml", mlp("") + "");
  std::string text = slurp(named);
  text.replace(text.find("output_dir = \"\"\n"), 16, "");
  text.replace(text.find("name = \"files\""), 14, "name = \"" + std::string(300, 'a') + "\"");
  write(named, text);
  r = app("train " + named.string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("is 300 bytes long; a directory name holds at most 255 bytes") != std::string::npos);
}

TEST_CASE("a loss that grows by orders of magnitude stops the run, unless divergence_factor = 0",
          "[files][divergence]") {
  const auto dir = kiln::test::temp_dir("files_diverge");
  // A linear model whose learning rate grows 1.3x a step: the loss grows without bound yet stays finite.
  const std::string sched = "[optimizer.schedule]\ntype = \"exponential\"\ndecay_rate = 1.3\ndecay_steps = 1\n";
  std::string text = mlp(dir / "run", sched, 0);
  text.replace(text.find("learning_rate = 0.05"), 20, "learning_rate = 0.01");
  text.replace(text.find("epochs = 2"), 10, "epochs = 5");
  const auto cfg = write(dir / "div.toml", text);
  auto r = app("train " + cfg.string());
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("training stopped: the loss diverged at step") != std::string::npos);
  CHECK(r.output.find("more than 100 times the mean of the first 10 steps") != std::string::npos);
  r = app("train " + cfg.string() + " --overwrite --set train.divergence_factor=0");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("done: 100 steps") != std::string::npos);
  r = app("train " + cfg.string() + " --overwrite --set train.divergence_factor=0.5");
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("'train.divergence_factor'") != std::string::npos);
}

TEST_CASE("a plugin path that is a FIFO is refused instead of blocking the load", "[files][plugins]") {
  const auto dir = kiln::test::temp_dir("files_plugin_fifo");
  REQUIRE(::mkfifo((dir / "libkiln_fifo.so").c_str(), 0644) == 0);
  const auto cfg = write(dir / "p.toml", "[plugins]\nload = [\"libkiln_fifo.so\"]\n" + mlp(dir / "run"));
  auto r = app_bounded("plan " + cfg.string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("libkiln_fifo.so: is a FIFO (named pipe), not a regular file") != std::string::npos);
  // In a plugin directory it is listed as failed, and the rest load.
  r = app_bounded("--plugin-dir " + dir.string() + " plugins");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("FAILED " + (dir / "libkiln_fifo.so").string()) != std::string::npos);
}
