// Each MPI rank reads only its share of the training data: over uncompressed IDX files (read by pread), shuffled and
// augmented by a parallel map, 2 ranks train the bits one process with 2 replicas trains, each reading about half
// of the bytes, and a run stopped mid-epoch resumes exactly with 2 ranks or with one process. Skipped without
// mpirun, the mpi plugin or the dataset.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>

#include "kiln/checkpoint.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kMpirun = "timeout -s KILL 120 mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp";
const std::string kImages = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
const std::string kLabels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";

kiln::test::AppResult shell(const std::string& cmd) { return kiln::test::run_shell(cmd); }

// run.toml in `dir` next to uncompressed copies of the Fashion-MNIST test set: an MLP trained data-parallel on
// 1000 examples (31 batches of 32 and one of 8 per epoch), flipped at random by 2 map workers and fully shuffled;
// decoded_budget = "off" so the source reads each example it is asked for from the file.
void write_run(const fs::path& dir) {
  REQUIRE(shell("gunzip -c " + kImages + " > " + (dir / "images").string()).exit_code == 0);
  REQUIRE(shell("gunzip -c " + kLabels + " > " + (dir / "labels").string()).exit_code == 0);
  std::ofstream(dir / "run.toml")
      << "[run]\nseed = 42\n"
      << "[device]\nbackend = \"cpu\"\nthreads = 1\n"
      << "[strategy]\ntype = \"data_parallel\"\n"
      << "[model]\ninput_shape = [1, 28, 28]\nloss = \"softmax_cross_entropy\"\n"
      << "[[model.layers]]\ntype = \"flatten\"\n"
      << "[[model.layers]]\ntype = \"dense\"\nunits = 64\nactivation = \"relu\"\n"
      << "[[model.layers]]\ntype = \"dense\"\nunits = 10\n"
      << "[optimizer]\ntype = \"adam\"\nlearning_rate = 1e-3\n"
      << "[data]\ndecoded_budget = \"off\"\n"
      << "[train]\nepochs = 2\nbatch_size = 32\nevaluate = false\nprogress = \"none\"\n"
      << "[data.train]\nstages = [\n"
      << "  {type = \"idx\", images = \"images\", labels = \"labels\", limit = 1000},\n"
      << "  {type = \"map\", workers = 2, ops = [{op = \"scale\", factor = 0.00392156862745098}, "
         "{op = \"flip_horizontal\"}]},\n"
      << "  {type = \"shuffle\", buffer = 1000},\n"
      << "  {type = \"batch\"},\n]\n";
}

// One process with 2 replicas on 2 logical CPU devices.
const std::string kOneProcess = " --set device.virtual_devices=2 --set 'strategy.devices=[0, 1]'";
// One replica per rank, gradients summed in rank order.
const std::string kPerRank =
    " --set device.virtual_devices=1 --set 'strategy.devices=[0]' --set 'strategy.communicator=\"mpi\"' --set "
    "'strategy.reduction=\"fixed_order\"'";

std::string out_dir(const fs::path& dir, const std::string& name) {
  return " --set 'train.output_dir=\"" + (dir / name).string() + "\"'";
}

kiln::test::AppResult one(const fs::path& dir, const std::string& args) {
  return kiln::test::run_app("train " + (dir / "run.toml").string() + kOneProcess + args);
}

kiln::test::AppResult ranks(const fs::path& dir, const std::string& args) {
  return shell(kMpirun + " -np 2 " + KILN_APP + " train " + (dir / "run.toml").string() + kPerRank + args);
}

bool same_weights(const fs::path& a, const fs::path& b) {
  auto ca = kiln::load_checkpoint(a.string()), cb = kiln::load_checkpoint(b.string());
  if (ca.step != cb.step || ca.tensors.size() != cb.tensors.size()) return false;
  for (const auto& [name, t] : ca.tensors)
    if (!cb.tensors.count(name) || cb.tensors.at(name).data != t.data) return false;
  return true;
}

// The "data.train read N bytes from files (rank 0: A, rank 1: B)" line: {N} or {N, A, B}.
std::vector<uint64_t> bytes_read(const std::string& output) {
  std::smatch m;
  std::vector<uint64_t> out;
  if (std::regex_search(output, m,
                        std::regex("data.train read ([0-9]+) bytes from files \\(rank 0: ([0-9]+), rank "
                                   "1: ([0-9]+)\\)"))) {
    for (int i = 1; i <= 3; ++i) out.push_back(std::stoull(m[i]));
  } else if (std::regex_search(output, m, std::regex("data.train read ([0-9]+) bytes from files"))) {
    out.push_back(std::stoull(m[1]));
  }
  return out;
}

}  // namespace

TEST_CASE("2 MPI ranks each read half of the shuffled IDX examples and train the bits of one process",
          "[mpi][data_share]") {
  if (std::string why = kiln::test::mpi_missing(); !why.empty()) KILN_SKIP(why);
  auto dir = kiln::test::temp_dir("mpi_share");
  write_run(dir);
  auto ref = one(dir, out_dir(dir, "one"));
  INFO(ref.output);
  REQUIRE(ref.exit_code == 0);
  auto mpi = ranks(dir, out_dir(dir, "two"));
  INFO(mpi.output);
  REQUIRE(mpi.exit_code == 0);
  CHECK(same_weights(dir / "one" / "checkpoint.kiln", dir / "two" / "checkpoint.kiln"));
  // One process reads 2 epochs x 1000 examples x 785 bytes (+ the 16- and 8-byte headers). Each rank reads its 16
  // rows of the 31 full batches and the last batch of 8 whole: 504 examples an epoch.
  const auto single = bytes_read(ref.output), shared = bytes_read(mpi.output);
  REQUIRE(single.size() == 1);
  REQUIRE(shared.size() == 3);
  CHECK(single[0] == 2 * 1000 * 785 + 24);
  CHECK(shared[1] == 2 * 504 * 785 + 24);
  CHECK(shared[2] == 2 * 504 * 785 + 24);
  CHECK(shared[0] == shared[1] + shared[2]);
}

TEST_CASE("2 MPI ranks reading their shares stop mid-epoch and resume exactly, with 2 ranks or in one process",
          "[mpi][data_share]") {
  if (std::string why = kiln::test::mpi_missing(); !why.empty()) KILN_SKIP(why);
  auto dir = kiln::test::temp_dir("mpi_share_resume");
  write_run(dir);
  auto ref = one(dir, out_dir(dir, "ref"));
  INFO(ref.output);
  REQUIRE(ref.exit_code == 0);
  // Stopped at step 45: batch 13 of epoch 2, the next batch already pulled (by 2 ranks: each filled its half of it).
  for (const auto& [stop, resume] : std::vector<std::pair<std::string, std::string>>{
           {"ranks", "ranks"}, {"ranks", "one"}, {"one", "ranks"}, {"one", "one"}}) {
    CAPTURE(stop, resume);
    const std::string out = out_dir(dir, "cut_" + stop + "_" + resume);
    const std::string cut = out + " --set train.max_steps=45", more = out + " --resume --set train.max_steps=0";
    auto first = stop == "ranks" ? ranks(dir, cut) : one(dir, cut);
    INFO(first.output);
    REQUIRE(first.exit_code == 0);
    REQUIRE_THAT(first.output, Catch::Contains("stopped at max_steps = 45"));
    auto second = resume == "ranks" ? ranks(dir, more) : one(dir, more);
    INFO(second.output);
    REQUIRE(second.exit_code == 0);
    REQUIRE_THAT(second.output, Catch::Contains("mid-epoch: 13 batches of epoch 2 done"));
    CHECK(same_weights(dir / "ref" / "checkpoint.kiln", dir / ("cut_" + stop + "_" + resume) / "checkpoint.kiln"));
  }
}

TEST_CASE("2 MPI ranks read every row when a cache follows the batch stage", "[mpi][data_share]") {
  if (std::string why = kiln::test::mpi_missing(); !why.empty()) KILN_SKIP(why);
  auto dir = kiln::test::temp_dir("mpi_share_cache");
  write_run(dir);
  // A cache after the batch would record a rank's partial batches (a file cache could be read by another rank).
  std::ifstream in(dir / "run.toml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("{type = \"batch\"},"), 18, "{type = \"batch\"}, {type = \"cache\"},");
  std::ofstream(dir / "run.toml") << text;
  auto mpi = ranks(dir, out_dir(dir, "two"));
  INFO(mpi.output);
  REQUIRE(mpi.exit_code == 0);
  const auto shared = bytes_read(mpi.output);
  REQUIRE(shared.size() == 3);
  CHECK(shared[1] == 1000 * 785 + 24);  // the first epoch reads everything; the second is served by the cache
  CHECK(shared[2] == shared[1]);
}
