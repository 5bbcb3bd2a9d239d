// Helpers shared by Kiln's tests: a registry with every built plugin loaded, temp dirs, running the app.
#pragma once
#include <filesystem>
#include <sstream>
#include <string>

#include "kiln/data.hpp"
#include "kiln/model.hpp"
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
// The [model] table of `toml` parsed with this build's layers, its weights seeded with `seed`.
ModelSpec model_from(const std::string& toml, uint32_t seed = 7);
// A batch of `n` examples of shape `x`: features ~ N(0, 1), class labels below `classes`, all from `seed`.
Element random_batch(int64_t n, const Shape& x, int64_t classes, uint32_t seed);

// Runs the built `kiln` app with `args` (shell-quoted by the caller), capturing its output.
AppResult run_app(const std::string& args);

// Skipping (Catch2 v2 has no SKIP; test_main.cpp): a test binary whose every test case skipped exits with
// kSkipReturnCode, which CTest reports as "Skipped". skip() records the running test case as skipped and prints
// kSkipMarker with the reason; use KILN_SKIP, which also leaves the test case.
inline constexpr int kSkipReturnCode = 4;
inline constexpr const char* kSkipMarker = "KILN-SKIPPED:";
void skip(const std::string& reason);

}  // namespace kiln::test

// Ends the current test case as skipped, saying why: KILN_SKIP("no CUDA device: " << reason).
#define KILN_SKIP(why)                        \
  do {                                        \
    std::ostringstream kiln_skip_why_;        \
    kiln_skip_why_ << why;                    \
    ::kiln::test::skip(kiln_skip_why_.str()); \
    return;                                   \
  } while (0)
