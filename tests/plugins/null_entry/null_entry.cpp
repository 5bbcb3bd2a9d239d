// A plugin whose entry is broken in one way (chosen by KILN_TEST_NULL_*); see CMakeLists.txt.
#include "kiln/plugin.hpp"

#if defined(KILN_TEST_NULL_entry)
// The exported entry symbol exists, but the pointer it holds is null.
extern "C" {
__attribute__((visibility("default"))) const void* kiln_plugin = nullptr;
}
#else
namespace {
[[maybe_unused]] const kiln::PluginDescriptor* descriptor() {
#if defined(KILN_TEST_NULL_descriptor)
  return nullptr;
#elif defined(KILN_TEST_NULL_name)
  static const kiln::PluginDescriptor d{nullptr, "1.0", kiln::kApiVersion, KILN_BUILD_FINGERPRINT, "no name"};
  return &d;
#else
  static const kiln::PluginDescriptor d{"null_parts", "1.0", kiln::kApiVersion, KILN_BUILD_FINGERPRINT, "test"};
  return &d;
#endif
}
[[maybe_unused]] void register_all(kiln::Registry& reg) { reg.add_stage("never_registered", nullptr); }
}  // namespace

#if defined(KILN_TEST_NULL_descriptor_fn)
KILN_PLUGIN(nullptr, register_all)
#elif defined(KILN_TEST_NULL_register_fn)
KILN_PLUGIN(descriptor, nullptr)
#else
KILN_PLUGIN(descriptor, register_all)
#endif
#endif
