// The tests' main: Catch2 v2 plus skipping. Catch2 v2 has no SKIP, so a test case that cannot run here (no
// device, no dataset) calls KILN_SKIP(reason): it is recorded, printed with the marker below, and the process
// exits with kSkipReturnCode when every test case it ran was skipped. CTest runs one test case per process and
// maps that code to "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt), so a skipped test never shows as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace kiln::test {
namespace {

struct SkipState {
  bool current = false;  // the running test case called skip()
  std::string reason;
  int ran = 0;                                               // test cases that ended
  std::vector<std::pair<std::string, std::string>> skipped;  // name, reason
};

SkipState& state() {
  static SkipState s;
  return s;
}

class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    state().current = false;
    state().reason.clear();
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    TestEventListenerBase::testCaseEnded(stats);
    ++state().ran;
    // A test case that failed before it skipped is a failure, not a skip.
    const bool failed = stats.totals.assertions.failed > 0;
    if (state().current && !failed) state().skipped.emplace_back(stats.testInfo.name, state().reason);
    // One line per test case for the count printed after a ctest run (tests/ctest_summary.cmake); ctest clears
    // the file before the run.
    std::ofstream(KILN_BINARY_DIR "/Testing/Temporary/KilnTestCases.log", std::ios::app)
        << (failed            ? "failed"
            : state().current ? "skipped"
                              : "passed")
        << '\t' << stats.testInfo.name << '\n';
  }
  void testRunEnded(const Catch::TestRunStats& stats) override {
    TestEventListenerBase::testRunEnded(stats);
    if (state().skipped.empty()) return;
    std::cout << state().skipped.size() << " of " << state().ran << " test case(s) skipped (not passed):\n";
    for (const auto& [name, why] : state().skipped) std::cout << "  " << name << ": " << why << "\n";
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

void skip(const std::string& reason) {
  state().current = true;
  state().reason = reason;
  std::cout << kSkipMarker << " " << reason << std::endl;
}

}  // namespace kiln::test

#if KILN_TEST_ASAN
// Sanitizer builds: the runtimes' settings for this process (read before main) and, through the environment, for the
// kiln processes the tests start (run_app); settings the caller put in ASAN_OPTIONS / UBSAN_OPTIONS win.
//   allocator_may_return_null=1  an allocation above ASan's maximum (1 TiB) returns null as malloc does, instead of
//                                aborting: the backends answer it with OutOfMemory, and tests ask for 2^62 bytes.
//   print_stacktrace=1           an undefined-behaviour report shows where (the build stops at the first one).
// Suppressions: none are needed (docs/user_guide.md, "Sanitizers and fuzzing").
namespace {
constexpr const char* kAsanOptions = "allocator_may_return_null=1";
constexpr const char* kUbsanOptions = "print_stacktrace=1:halt_on_error=1";
}  // namespace
extern "C" const char* __asan_default_options() { return kAsanOptions; }
extern "C" const char* __ubsan_default_options() { return kUbsanOptions; }
#endif

int main(int argc, char* argv[]) {
  using kiln::test::kSkipReturnCode;
#if KILN_TEST_ASAN
  ::setenv("ASAN_OPTIONS", kAsanOptions, 0);
  ::setenv("UBSAN_OPTIONS", kUbsanOptions, 0);
#endif
  Catch::Session session;
  if (const int bad = session.applyCommandLine(argc, argv)) return bad;
  const int result = session.run();
  const auto& s = kiln::test::state();
  // A name filter that matches no test case (CTest passes each test's name; a name with ';' is cut in two by CMake)
  // must not pass as if the test had run.
  if (result == 0 && s.ran == 0 && session.config().testSpec().hasFilters() && !session.config().listTests() &&
      !session.config().listTestNamesOnly() && !session.config().listTags()) {
    std::cerr << "no test case matched the filter: nothing ran\n";
    return 1;
  }
  if (result != 0) return result == kSkipReturnCode ? kSkipReturnCode + 1 : result;  // failures never read as a skip
  if (!s.skipped.empty() && static_cast<int>(s.skipped.size()) == s.ran) return kSkipReturnCode;
  return 0;
}
