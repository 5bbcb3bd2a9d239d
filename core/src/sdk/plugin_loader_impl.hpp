// What guards the host while plugin code runs during a load (plugin_safety.cpp).
#pragma once
#include <signal.h>

#include <string>

namespace kiln::detail {

// Names the plugin being loaded if its code (static initializers, descriptor(), register_all) crashes with SIGSEGV,
// SIGBUS, SIGILL, SIGFPE or SIGABRT, or calls exit(), before the guard ends: the process still dies as it would
// have, but with one line on stderr saying which file did it. Installs its signal handlers for its own lifetime.
class PluginLoadGuard {
 public:
  explicit PluginLoadGuard(const std::string& path);
  ~PluginLoadGuard();
  PluginLoadGuard(const PluginLoadGuard&) = delete;
  PluginLoadGuard& operator=(const PluginLoadGuard&) = delete;
  // For a `kiln plugins --check` child: print nothing, the parent reports how the child ended.
  static void quiet();

 private:
  static constexpr int kSignals = 5;
  struct sigaction old_[kSignals];
  std::string previous_;  // the path of an enclosing load, if any
  bool was_active_ = false;
};

// "SIGSEGV" for 11; "signal N" for one without a name here.
std::string signal_name(int sig);

}  // namespace kiln::detail
