// Helpers shared by Kiln's tests: a registry with every built plugin loaded, temp dirs, running the app.
#pragma once
#include <filesystem>
#include <sstream>
#include <string>

#include "kiln/data.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "kiln/plugin_loader.hpp"

// KILN_TEST_ASAN: 1 in an AddressSanitizer build (KILN_SANITIZE, the asan preset). Freed memory waits in ASan's
// quarantine (256 MiB) before reuse and every allocation carries red zones, so bounds on the process's RSS do not
// hold there; tests of such bounds skip (they run in the normal build).
#if defined(__SANITIZE_ADDRESS__)
#define KILN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_TEST_ASAN 1
#endif
#endif
#ifndef KILN_TEST_ASAN
#define KILN_TEST_ASAN 0
#endif

namespace kiln::test {

inline constexpr bool kAddressSanitizer = KILN_TEST_ASAN != 0;

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

// Runs `cmd` with /bin/sh, capturing its stdout and stderr.
AppResult run_shell(const std::string& cmd);
// Runs the built `kiln` app with `args` (shell-quoted by the caller), capturing its output.
AppResult run_app(const std::string& args);
// Why this host cannot run the app across MPI ranks (no mpirun, no mpi plugin, no Fashion-MNIST); "" when it can.
std::string mpi_missing();

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
