// Stopping a run of MPI ranks the documented ways (SIGTERM to `kiln launch`, SIGUSR1 to a plain mpirun) ends as a
// single process does: every rank finishes the step, rank 0 writes the checkpoint, the exit code is 128 + signal.
// Open MPI's mpirun ends the ranks itself one second (--mca odls_base_sigkill_timeout) after a SIGTERM or SIGINT;
// these runs set that grace to 0, as for a model whose step and checkpoint take longer than it, so a stop that
// passed through mpirun's own shutdown would never write the checkpoint. Skipped without mpirun, the mpi plugin or
// the dataset.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kSample = std::string(KILN_SOURCE_DIR) + "/samples/fashion_mnist_dp.toml";
// One device per rank, the mpi communicator, one epoch without evaluation, a step record after every step.
const std::string kRun =
    " --set train.epochs=1 --set train.evaluate=false --set 'train.progress=\"none\"' --set log.every_steps=1"
    " --set device.virtual_devices=1 --set 'strategy.devices=[0]' --set 'strategy.communicator=\"mpi\"'";

kiln::test::AppResult shell(const std::string& cmd) { return kiln::test::run_shell(cmd); }

// Skips the test case unless mpirun, the mpi plugin and the dataset are there.
#define REQUIRE_MPI_STOP()                                                         \
  do {                                                                             \
    if (std::string why = kiln::test::mpi_missing(); !why.empty()) KILN_SKIP(why); \
  } while (0)

// Runs `command` (which writes its step records to `run`/metrics.jsonl) in the background, sends `sig` to it once a
// step is recorded, waits and prints "rc=N". The outer timeout bounds the whole script.
kiln::test::AppResult stop_after_a_step(const std::string& command, const fs::path& run, const std::string& sig) {
  const fs::path script = run.parent_path() / "stop.sh";
  std::ofstream(script) << command << " &\np=$!\nfor i in $(seq 600); do grep -qs event.:.step "
                        << (run / "metrics.jsonl").string()
                        << " && break; kill -0 $p || break; sleep 0.1; done\nsleep 0.3\nkill -" << sig
                        << " $p\nwait $p\necho rc=$?\n";
  return shell("timeout -s KILL 100 bash " + script.string());
}

std::string out_dir(const fs::path& run) { return " --set 'train.output_dir=\"" + run.string() + "\"'"; }

// What every stop must leave: a whole mid-epoch checkpoint past step 0 and no temporary file.
kiln::Checkpoint check_stopped_run(const fs::path& run) {
  for (const auto& e : fs::directory_iterator(run)) {
    INFO(e.path());
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }
  REQUIRE(fs::exists(run / "checkpoint.kiln"));
  auto ckpt = kiln::load_checkpoint((run / "checkpoint.kiln").string());
  CHECK(ckpt.step > 0);
  CHECK_FALSE(ckpt.data_state.empty());
  return ckpt;
}

}  // namespace

TEST_CASE("SIGTERM to kiln launch ends like one process: the step, rank 0's checkpoint, exit 143, and --resume",
          "[mpi]") {
  REQUIRE_MPI_STOP();
  auto dir = kiln::test::temp_dir("mpi_stop_launch");
  const fs::path run = dir / "run";
  const std::string launch =
      std::string(KILN_APP) +
      " launch -n 2 --mpirun-arg=--oversubscribe --mpirun-arg=--mca --mpirun-arg=btl "
      "--mpirun-arg=self,tcp --mpirun-arg=--mca --mpirun-arg=odls_base_sigkill_timeout --mpirun-arg=0 " +
      kSample + kRun + out_dir(run);
  auto r = stop_after_a_step(launch, run, "TERM");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("rc=143"));
  CHECK_THAT(r.output, Catch::Contains("kiln launch: asking every rank to stop after the current step"));
  CHECK_THAT(r.output, !Catch::Contains("did not complete within"));
  const auto ckpt = check_stopped_run(run);
  // The same launch with --resume continues from it.
  auto rest = kiln::test::run_app(
      "launch -n 2 --mpirun-arg=--oversubscribe --mpirun-arg=--mca --mpirun-arg=btl "
      "--mpirun-arg=self,tcp " +
      kSample + kRun + out_dir(run) + " --resume --set train.max_steps=" + std::to_string(ckpt.step + 5));
  INFO(rest.output);
  CHECK(rest.exit_code == 0);
  CHECK_THAT(rest.output,
             Catch::Contains("mid-epoch") && Catch::Contains("done: " + std::to_string(ckpt.step + 5) + " steps"));
}

TEST_CASE("SIGUSR1 to a plain mpirun stops every rank after the same step with rank 0's checkpoint and exit 143",
          "[mpi]") {
  REQUIRE_MPI_STOP();
  auto dir = kiln::test::temp_dir("mpi_stop_usr1");
  const fs::path run = dir / "run";
  auto r = stop_after_a_step(std::string("mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp -np 2 ") +
                                 KILN_APP + " train " + kSample + kRun + out_dir(run),
                             run, "USR1");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("rc=143"));
  CHECK(std::regex_search(r.output, std::regex("stopped by SIGTERM after step [0-9]+ .*checkpoint written to")));
  check_stopped_run(run);
}
