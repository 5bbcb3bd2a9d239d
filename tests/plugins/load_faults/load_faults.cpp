// A plugin whose static initializer announces itself, then crashes, exits or hangs (KILN_TEST_LOAD_<kind>).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kiln/plugin.hpp"

namespace {

#if defined(KILN_TEST_LOAD_probe)
constexpr const char* kName = "load_probe";
#elif defined(KILN_TEST_LOAD_crash)
constexpr const char* kName = "load_crash";
#elif defined(KILN_TEST_LOAD_exit)
constexpr const char* kName = "load_exit";
#else
constexpr const char* kName = "load_hang";
#endif

// Runs when the library is loaded, before the loader sees its entry: the tests look for this line to tell whether
// any code of a refused plugin ran.
const int initialized = [] {
  std::fprintf(stderr, "%s: static initializer ran\n", kName);
  std::fflush(stderr);
#if defined(KILN_TEST_LOAD_crash)
  rlimit none{0, 0};
  ::setrlimit(RLIMIT_CORE, &none);      // the crash is the test's point: no core file
  volatile std::uintptr_t address = 0;  // not a literal null, which the compiler would turn into a trap (SIGILL)
  *reinterpret_cast<volatile int*>(address) = 1;
#elif defined(KILN_TEST_LOAD_exit)
  std::exit(3);
#elif defined(KILN_TEST_LOAD_hang)
  ::sleep(60);  // bounded, should a test fail to kill it
#endif
  return 1;
}();

const kiln::PluginDescriptor* descriptor() {
  static const kiln::PluginDescriptor d{kName, "0.1.0", kiln::kApiVersion, KILN_BUILD_FINGERPRINT,
                                        "test plugin with a static initializer"};
  return &d;
}
void register_all(kiln::Registry&) { (void)initialized; }

}  // namespace

KILN_PLUGIN(descriptor, register_all)
