// Hardening (issue 15): inputs that used to crash the process are clean errors. A thread count the host cannot
// use is a config error naming [device] threads; a thread pool that cannot start its threads is a DeviceError,
// never std::terminate; a plugin with a null entry, null functions or a null descriptor is a PluginError naming
// the file, never a segfault.
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <fstream>
#include <sstream>

#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/plugin_loader.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

std::unique_ptr<kiln::Backend> cpu_backend(int threads) {
  return kiln::test::registry().backend("cpu")(kiln::BackendOptions::parse("threads = " + std::to_string(threads)));
}

}  // namespace

TEST_CASE("cpu backend refuses a thread count far above the host's cores, naming [device] threads",
          "[hardening][threads]") {
  for (int threads : {100000, 1025}) {
    INFO(threads);
    CHECK_THROWS_MATCHES(cpu_backend(threads), kiln::ConfigError,
                         Catch::Matchers::Predicate<kiln::ConfigError>([&](const kiln::ConfigError& e) {
                           const std::string m = e.what();
                           return m.find("[device] threads = " + std::to_string(threads)) != std::string::npos &&
                                  m.find("at most") != std::string::npos && m.find("threads = 0") != std::string::npos;
                         }));
  }
  // 0 (one per core) and small counts still open.
  CHECK(cpu_backend(0)->open(0) != nullptr);
  CHECK(cpu_backend(2)->open(0) != nullptr);
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

TEST_CASE("a thread pool that cannot start its threads is a DeviceError, not std::terminate", "[hardening][threads]") {
  // As many threads as the backend allows (4 per core): more worker stacks than glibc's cache of freed stacks
  // could hold, so they need new mappings.
  cpu_set_t set;
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int threads = std::min(1024, 4 * CPU_COUNT(&set));
  auto backend = cpu_backend(threads);
  // In a child: an address-space limit just above what the process uses leaves no room for the workers' stacks.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t used = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    rlimit lim{used + (6u << 20), used + (6u << 20)};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(10);
    try {
      auto dev = backend->open(0);
      ::_exit(11);  // the threads started after all: the limit did not bite (checked below)
    } catch (const kiln::DeviceError& e) {
      const std::string m = e.what();
      ::_exit(m.find("[device] threads = " + std::to_string(threads)) != std::string::npos && m.find("worker thread") != std::string::npos
                  ? 0
                  : 12);
    } catch (...) {
      ::_exit(13);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));  // not killed by SIGABRT from std::terminate
  if (WEXITSTATUS(status) == 11) {
    WARN("skipped: the address-space limit did not stop thread creation on this host");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("plugins with a null entry, null functions, a null descriptor or no name are refused naming the file",
          "[hardening][plugins]") {
  struct Case {
    const char* lib;
    const char* says;
  };
  const Case cases[] = {
      {"libkiln_null_entry.so", "'kiln_plugin' entry is a null pointer"},
      {"libkiln_null_descriptor_fn.so", "descriptor() function is null"},
      {"libkiln_null_register_fn.so", "register_all() function is null"},
      {"libkiln_null_descriptor.so", "descriptor() returned null"},
      {"libkiln_null_name.so", "has no name"},
  };
  for (const auto& c : cases) {
    const std::string path = std::string(KILN_TEST_PLUGIN_DIR) + "/" + c.lib;
    INFO(path);
    REQUIRE(fs::exists(path));
    kiln::PluginLoader loader;
    kiln::Registry reg;
    CHECK_THROWS_MATCHES(loader.load(path, reg), kiln::PluginError,
                         Catch::Matchers::Predicate<kiln::PluginError>([&](const kiln::PluginError& e) {
                           const std::string m = e.what();
                           return m.find(path) != std::string::npos && m.find(c.says) != std::string::npos;
                         }));
    CHECK_FALSE(reg.has_stage("never_registered"));
  }
}

TEST_CASE("kiln plugins and kiln train list a null-entry plugin as failed instead of crashing", "[hardening][plugins]") {
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
