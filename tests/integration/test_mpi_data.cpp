// Ranks of one MPI run that would read different data (the same config resolved in other directories or on other
// hosts) are refused at start, before a step mixes their examples. Skipped without mpirun or the mpi plugin.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

kiln::test::AppResult shell(const std::string& cmd) { return kiln::test::run_shell(cmd); }

// A rank's directory: run.toml (the same text in every directory) reading data.csv by a relative path, and its own
// data.csv: 64 rows of 4 features and a class in [0, 3); `changed_row` gets another first feature.
void rank_dir(const fs::path& d, int changed_row) {
  fs::create_directories(d);
  std::ofstream(d / "run.toml")
      << "[device]\nbackend = \"cpu\"\nvirtual_devices = 1\nmemory_limit = \"256MiB\"\n"
      << "[strategy]\ntype = \"data_parallel\"\ndevices = [0]\ncommunicator = \"mpi\"\n"
      << "[model]\ninput_shape = [4]\nloss = \"softmax_cross_entropy\"\n"
      << "[[model.layers]]\ntype = \"dense\"\nunits = 3\n"
      << "[train]\nepochs = 1\nbatch_size = 16\nevaluate = false\nprogress = \"none\"\n"
      << "output_dir = \"out\"\n"
      << "[data.train]\nstages = [{type = \"csv\", path = \"data.csv\"}, {type = \"batch\"}]\n";
  std::ofstream f(d / "data.csv");
  for (int r = 0; r < 64; ++r)
    f << (r == changed_row ? 9.5 : 0.01 * r) << "," << 0.02 * r << "," << 0.5 << "," << 1.0 - 0.01 * r << "," << r % 3
      << "\n";
}

}  // namespace

TEST_CASE("MPI ranks whose data files differ are refused at start, naming both ranks, hosts and files", "[mpi]") {
  if (shell("command -v mpirun").exit_code != 0)
    KILN_SKIP("mpirun not found: install OpenMPI (Debian: apt-get install openmpi-bin libopenmpi-dev)");
  if (!fs::exists(std::string(KILN_PLUGIN_DIR) + "/libkiln_mpi.so"))
    KILN_SKIP("the mpi plugin was not built (CMake did not find MPI)");
  auto dir = kiln::test::temp_dir("mpi_data");
  // Each rank starts in its own directory (mpirun -wdir), as ranks on two hosts would: the same run.toml, but rank
  // 1's data.csv differs in one value, so the example count and shapes agree and only the contents tell them apart.
  rank_dir(dir / "a", -1);
  rank_dir(dir / "b", 40);
  const std::string mpirun = "timeout -s KILL 60 mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp";
  const std::string rank = std::string(KILN_APP) + " train run.toml";
  auto r = shell(mpirun + " -np 1 -wdir " + (dir / "a").string() + " " + rank + " : -np 1 -wdir " +
                 (dir / "b").string() + " " + rank);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data error") && Catch::Contains("would train on different data") &&
                           Catch::Contains("rank 1 (host ") && Catch::Contains("rank 0 (host ") &&
                           Catch::Contains("[data.train] path") && Catch::Contains((dir / "a" / "data.csv").string()) &&
                           Catch::Contains((dir / "b" / "data.csv").string()));
  CHECK_FALSE(fs::exists(dir / "a" / "out" / "checkpoint.kiln"));
  // The same files on both ranks train.
  rank_dir(dir / "b", -1);
  auto same = shell(mpirun + " -np 1 -wdir " + (dir / "a").string() + " " + rank + " : -np 1 -wdir " +
                    (dir / "b").string() + " " + rank);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  CHECK(fs::exists(dir / "a" / "out" / "checkpoint.kiln"));
}
