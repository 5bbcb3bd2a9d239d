#include "test_support.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>

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

std::filesystem::path temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto p = std::filesystem::path(KILN_BINARY_DIR) / "test-tmp" /
           (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

AppResult run_app(const std::string& args) {
  AppResult r;
  std::string cmd = std::string(KILN_APP) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return {127, "popen failed"};
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace kiln::test
