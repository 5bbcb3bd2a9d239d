// kiln launch: `mpirun -np N [--host ...] <this kiln> train run.toml ...`, so one command starts every rank.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "kiln/error.hpp"

namespace kiln::app {

std::vector<std::string> launch_argv(const Options& o, const LaunchOptions& lo, const std::string& self) {
  if (lo.ranks < 1) throw ConfigError("kiln launch -n " + std::to_string(lo.ranks) + ": expected at least 1 rank");
  std::vector<std::string> a{lo.mpirun, "-np", std::to_string(lo.ranks)};
  if (!lo.hosts.empty()) a.insert(a.end(), {"--host", lo.hosts});
  if (::geteuid() == 0) a.push_back("--allow-run-as-root");  // OpenMPI refuses root without it (containers, CI)
  for (const auto& m : lo.mpirun_args) a.push_back(m);
  a.push_back(self);
  for (const auto& d : o.plugin_dirs) a.insert(a.end(), {"--plugin-dir", d});
  a.insert(a.end(), {"train", o.config});
  for (const auto& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (o.resume) a.push_back("--resume");
  if (o.overwrite) a.push_back("--overwrite");
  return a;
}

int cmd_launch(const Options& o, const LaunchOptions& lo) {
  std::error_code ec;
  const std::string self = std::filesystem::canonical("/proc/self/exe", ec).string();
  auto a = launch_argv(o, lo, self.empty() ? "kiln" : self);
  if (lo.dry_run) {
    for (size_t i = 0; i < a.size(); ++i) std::cout << (i ? " " : "") << a[i];
    std::cout << "\n";
    return 0;
  }
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout << std::flush;
  ::execvp(argv[0], argv.data());
  throw Error("kiln launch: cannot run '" + lo.mpirun + "' (" + std::string(std::strerror(errno)) +
              "); install OpenMPI (Debian: apt-get install openmpi-bin libopenmpi-dev) or pass --mpirun PATH");
}

}  // namespace kiln::app
