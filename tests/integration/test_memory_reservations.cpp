// Two concurrent `kiln train` processes on one device whose reservations do not fit: the second refuses at
// start naming the first; select = "most_free_memory" steers around it; a killed holder's file is cleaned up.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kiln/config.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/reservation.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace {

std::string holder_config(const fs::path& out, const std::string& name, int examples, double latency_ms,
                          const std::string& extra_device = "") {
  std::ostringstream os;
  os << "[run]\nname = \"" << name << "\"\n[device]\nbackend = \"cpu\"\nmemory_limit = \"60%\"\n"
     << extra_device
     << "[model]\ninput_shape = [8]\nloss = \"softmax_cross_entropy\"\n[[model.layers]]\ntype = \"dense\"\nunits = 4\n"
     << "[optimizer]\ntype = \"sgd\"\n[train]\nepochs = 1\nbatch_size = 4\nevaluate = false\ncheckpoint_every = 0\n"
     << "progress = \"none\"\noutput_dir = \"" << (out / name).string() << "\"\n"
     << "[data.train]\nstages = [{ type = \"synthetic\", shape = [8], classes = 4, examples = " << examples
     << ", seed = 1, latency_ms = " << latency_ms << " }, { type = \"batch\" }]\n";
  return os.str();
}

fs::path write(const fs::path& dir, const std::string& name, const std::string& text) {
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

// Starts `kiln train CONFIG` in the background with its output in `log`; returns its pid.
pid_t spawn_train(const fs::path& config, const fs::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::string app = KILN_APP, cmd = "train", cfg = config.string();
  char* argv[] = {app.data(), cmd.data(), cfg.data(), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, app.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

size_t reservation_files(const fs::path& root) {
  size_t n = 0;
  if (fs::exists(root))
    for (const auto& e : fs::recursive_directory_iterator(root)) n += e.path().extension() == ".json";
  return n;
}

}  // namespace

TEST_CASE("a second kiln train whose reservation does not fit refuses at start and names the holder", "[memory]") {
  fs::path dir = kiln::test::temp_dir("mem-resv");
  fs::path root = dir / "reservations";
  const char* old = std::getenv("KILN_RESERVATION_DIR");
  std::string saved = old ? old : "";
  ::setenv("KILN_RESERVATION_DIR", root.c_str(), 1);

  // The holder: 60% of the host, busy for minutes (a slow synthetic source) until we stop it.
  fs::path first_cfg = write(dir, "first.toml", holder_config(dir, "first", 100000, 20));
  pid_t first = spawn_train(first_cfg, dir / "first.log");
  REQUIRE(first > 0);
  for (int i = 0; i < 600 && reservation_files(root) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(reservation_files(root) == 1);

  // Another 60% of the same device cannot be honoured: refused before training, naming the holder.
  fs::path second_cfg = write(dir, "second.toml", holder_config(dir, "second", 8, 0));
  auto second = kiln::test::run_app("train " + second_cfg.string());
  INFO(second.output);
  CHECK(second.exit_code == 1);
  CHECK_THAT(second.output, Catch::Contains("cannot reserve"));
  CHECK_THAT(second.output, Catch::Contains("pid " + std::to_string(first)));
  CHECK_THAT(second.output, Catch::Contains("kiln train " + first_cfg.string()));
  CHECK_THAT(second.output, Catch::Contains("memory_limit to at most"));
  CHECK_THAT(second.output, !Catch::Contains("epoch 1/1"));
  CHECK_FALSE(fs::exists(dir / "second" / "metrics.jsonl"));

  // kiln devices shows the promise; select = "most_free_memory" picks the other (logical) device around it.
  auto devices = kiln::test::run_app("devices --backend cpu");
  CHECK_THAT(devices.output, Catch::Contains("reserved by Kiln jobs"));
  CHECK_THAT(devices.output, Catch::Contains("pid " + std::to_string(first)));
  fs::path steer_cfg = write(dir, "steer.toml",
                             holder_config(dir, "steer", 8, 0, "virtual_devices = 2\nselect = \"most_free_memory\"\n"));
  auto steer = kiln::test::run_app("plan " + steer_cfg.string());
  INFO(steer.output);
  CHECK(steer.exit_code == 0);
  CHECK_THAT(steer.output, Catch::Contains("step memory on cpu:1"));

  // A holder that dies (SIGKILL: no cleanup of its own) leaves a stale file that the next job removes.
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  auto third = kiln::test::run_app("train " + second_cfg.string());
  INFO(third.output);
  CHECK(third.exit_code == 0);
  CHECK(reservation_files(root) == 0);  // the stale file is gone, and the third job released its own at exit

  if (old)
    ::setenv("KILN_RESERVATION_DIR", saved.c_str(), 1);
  else
    ::unsetenv("KILN_RESERVATION_DIR");
}

namespace {

// KILN_RESERVATION_DIR for one test case.
class ReservationDir {
 public:
  explicit ReservationDir(const fs::path& root) {
    if (const char* old = std::getenv("KILN_RESERVATION_DIR")) saved_ = old, had_ = true;
    ::setenv("KILN_RESERVATION_DIR", root.c_str(), 1);
  }
  ~ReservationDir() {
    if (had_)
      ::setenv("KILN_RESERVATION_DIR", saved_.c_str(), 1);
    else
      ::unsetenv("KILN_RESERVATION_DIR");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("kiln plan reads the reservations of others without taking one and says DOES NOT FIT when train would refuse",
          "[memory]") {
  fs::path dir = kiln::test::temp_dir("plan-resv");
  fs::path root = dir / "reservations";
  ReservationDir env(root);
  // Another job (this test process, recorded under its run name) holds 60% of cpu:0.
  auto cpu = kiln::test::registry().backend("cpu")(kiln::BackendOptions{});
  const kiln::DeviceInfo d = cpu->enumerate().at(0);
  auto held = kiln::Reservation::acquire(d, d.total_memory / 100 * 60, d.total_memory, root.string(), "the-holder");
  REQUIRE(held);
  REQUIRE(reservation_files(root) == 1);

  // 60% more cannot be reserved: train would refuse, so the plan does not fit (exit 1) and says why and by whom.
  fs::path cfg = write(dir, "second.toml", holder_config(dir, "second", 8, 0));
  auto plan = kiln::test::run_app("plan " + cfg.string());
  INFO(plan.output);
  CHECK(plan.exit_code == 1);
  CHECK_THAT(plan.output, Catch::Contains("DOES NOT FIT beside the current reservations"));
  CHECK_THAT(plan.output, Catch::Contains("`kiln train` would refuse to reserve it"));
  CHECK_THAT(plan.output, Catch::Contains("pid " + std::to_string(::getpid())));
  CHECK_THAT(plan.output, Catch::Contains("run \"the-holder\""));
  CHECK_THAT(plan.output, Catch::Contains("reservations of other Kiln jobs: " + kiln::format_bytes(held->bytes())));
  CHECK_THAT(plan.output, Catch::Contains("lower [device] memory_limit to at most"));
  CHECK_THAT(plan.output, !Catch::Contains("verdict: FITS"));
  CHECK(reservation_files(root) == 1);  // the plan took none
  // And train agrees.
  auto train = kiln::test::run_app("train " + cfg.string());
  CHECK(train.exit_code == 1);
  CHECK_THAT(train.output, Catch::Contains("cannot reserve"));

  // 30% fits beside the holder: exit 0, the holder still listed.
  auto small = kiln::test::run_app("plan " + cfg.string() + " --set device.memory_limit='\"30%\"'");
  INFO(small.output);
  CHECK(small.exit_code == 0);
  CHECK_THAT(small.output, Catch::Contains("verdict: FITS"));
  CHECK_THAT(small.output, Catch::Contains("fits beside them"));
  CHECK_THAT(small.output, Catch::Contains("run \"the-holder\""));
  held.reset();
  CHECK(reservation_files(root) == 0);
}

TEST_CASE("kiln plan with growth = false on Vulkan claims no device memory and records no reservation",
          "[memory][vulkan]") {
  using namespace kiln;
  if (!test::registry().has_backend("vulkan")) KILN_SKIP("the vulkan backend is not built in this tree");
  auto vk = test::registry().backend("vulkan")(BackendOptions{});
  if (vk->enumerate().empty()) KILN_SKIP("no Vulkan device: " << vk->unavailable_reason());
  fs::path dir = test::temp_dir("plan-vk-growth");
  fs::path root = dir / "reservations";
  ReservationDir env(root);
  std::string text = holder_config(dir, "vk", 8, 0, "growth = false\n");
  text.replace(text.find("backend = \"cpu\""), 15, "backend = \"vulkan\"");
  text.replace(text.find("\"60%\""), 5, "\"256MiB\"");
  fs::path cfg = write(dir, "vk.toml", text);

  // In process, as `kiln plan` does it: the allocator holds nothing from the device after the plan.
  Session s(Config::load_file(cfg.string()), test::registry());
  if (auto train = s.make_pipeline("train")) s.model().label_shape = train->label_shape();
  s.open_devices(/*reserve=*/false);
  REQUIRE(s.devices().size() == 1);
  REQUIRE(s.devices()[0].device->info().backend == "vulkan");
  PlanCheck c = check_plan(s);
  INFO(c.report);
  CHECK(c.fits);
  CHECK_THAT(
      c.report,
      Catch::Contains("growth = false: `kiln train` claims the whole limit at start (`kiln plan` claims nothing)"));
  const MemoryStats& st = s.devices()[0].allocator->stats();
  CHECK(st.reserved == 0);
  CHECK(st.blocks == 0);
  CHECK(st.block_requests == 0);
  CHECK(s.devices()[0].allocator->limit() == (size_t{256} << 20));
  CHECK(reservation_files(root) == 0);

  // The app: exit 0, nothing recorded.
  auto plan = test::run_app("plan " + cfg.string());
  INFO(plan.output);
  CHECK(plan.exit_code == 0);
  CHECK_THAT(plan.output, Catch::Contains("`kiln plan` claims nothing"));
  CHECK(reservation_files(root) == 0);

  // kiln train does claim it (the same session opened with reserve): 256 MiB held up front, and reserved.
  Session t(Config::load_file(cfg.string()), test::registry());
  t.open_devices();
  CHECK(t.devices()[0].allocator->stats().reserved == (size_t{256} << 20));
  CHECK(reservation_files(root) == 1);
}
