#include "test_support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>

#include "kiln/config.hpp"

namespace kiln::test {

PluginLoader& loader() {
  static PluginLoader l;
  return l;
}

Registry& registry() {
  static Registry r = [] {
    Registry reg = Registry::with_builtins();
    loader().load_dir(KILN_PLUGIN_DIR, reg);
    return reg;
  }();
  return r;
}

ModelSpec model_from(const std::string& toml, uint32_t seed) {
  auto cfg = Config::load_string(toml, "model.toml");
  auto m = parse_model(*cfg.root().table("model"), registry());
  m.seed = seed;
  return m;
}

Element random_batch(int64_t n, const Shape& x, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  Element e;
  e.batch = n;
  e.x = HostTensor(x.with_batch(n));
  for (auto& v : e.x.data) v = d(rng);
  e.y = HostTensor(Shape{n});
  for (int64_t i = 0; i < n; ++i) e.y.data[size_t(i)] = float(rng() % uint32_t(classes));
  return e;
}

std::filesystem::path temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto p = std::filesystem::path(KILN_BINARY_DIR) / "test-tmp" /
           (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

AppResult run_shell(const std::string& cmd) {
  AppResult r;
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return {127, "popen failed"};
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

AppResult run_app(const std::string& args) { return run_shell(std::string(KILN_APP) + " " + args); }

std::string mpi_missing() {
  if (run_shell("command -v mpirun").exit_code != 0)
    return "mpirun not found: install OpenMPI (Debian: apt-get install openmpi-bin libopenmpi-dev)";
  if (!std::filesystem::exists(std::string(KILN_PLUGIN_DIR) + "/libkiln_mpi.so"))
    return "the mpi plugin was not built (CMake did not find MPI)";
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    return "Fashion-MNIST is not installed (Debian: dataset-fashion-mnist, see setup.sh)";
  return {};
}

}  // namespace kiln::test
