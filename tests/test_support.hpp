// Helpers shared by Kiln's tests: a registry with every built plugin loaded, temp dirs, running the app.
#pragma once
#include <filesystem>
#include <string>

#include "kiln/plugin.hpp"
#include "kiln/plugin_loader.hpp"

namespace kiln::test {

// The process-wide loader + registry with all plugins of this build (loaded once, kept for the process).
Registry& registry();
PluginLoader& loader();

// A fresh directory under the build tree, removed at process exit is not guaranteed; names are unique.
std::filesystem::path temp_dir(const std::string& tag);

struct AppResult {
  int exit_code = 0;
  std::string output;  // stdout + stderr
};
// Runs the built `kiln` app with `args` (shell-quoted by the caller), capturing its output.
AppResult run_app(const std::string& args);

}  // namespace kiln::test
