// Loads plugin libraries with Boost.DLL and keeps them loaded for the life of the loader.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kiln/plugin.hpp"

namespace kiln {

struct LoadedPlugin {
  std::string path;
  PluginDescriptor descriptor{};
  std::string error;  // non-empty when it failed to load
};

// How a plugin file fared when loaded alone in a child process (PluginLoader::check).
struct PluginCheck {
  enum class Result { ok, failed, crashed, exited, hung };
  Result result = Result::ok;
  std::string detail;  // ok: "name version"; failed: the loader's error; crashed: "signal 11: SIGSEGV";
                       // exited: "exit code 3"; hung: the timeout
  std::string output;  // what the child printed (stdout and stderr), at most its last 2000 characters
};

class PluginLoader {
 public:
  PluginLoader();
  ~PluginLoader();
  PluginLoader(const PluginLoader&) = delete;
  PluginLoader& operator=(const PluginLoader&) = delete;

  // Loads one library and registers its factories. Throws PluginError naming the file and, for an API
  // mismatch, both versions; a file or directory that others could write (untrusted_reason) is refused unopened.
  // While the library's initializers and register_all run, a crash signal or an exit() prints a line naming it.
  const LoadedPlugin& load(const std::string& path, Registry& reg);
  // Loads every libkiln_*.so in `dir`; failures (an untrusted directory: every file) are recorded, not thrown.
  void load_dir(const std::string& dir, Registry& reg);
  const std::vector<LoadedPlugin>& plugins() const;
  // The default plugin directories: those of $KILN_PLUGIN_PATH (colon-separated; empty entries are skipped) when it
  // is set, an entry that is not a directory being a PluginError; otherwise <exe dir>/../lib/kiln if it exists (the
  // build tree and the install both lay plugins out there), else none.
  static std::vector<std::string> default_dirs();
  // The plugin files of `dir` (libkiln_*.so), sorted.
  static std::vector<std::string> candidates(const std::string& dir);
  // Why code in `path` (a plugin file, or with `is_dir` a plugin directory) must not run: writable by every user,
  // by a group other than its owner's private one, or owned by someone but you and root. Empty when it may.
  static std::string untrusted_reason(const std::string& path, bool is_dir);
  // Loads `path` alone in a forked child (the trust checks first), killed after `timeout`; never throws.
  static PluginCheck check(const std::string& path, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
