#include "kiln/plugin.hpp"

namespace {
const kiln::PluginDescriptor* descriptor() {
  static const kiln::PluginDescriptor d{"bad_api", "9.9.9", kiln::kApiVersion + 1, KILN_BUILD_FINGERPRINT,
                                        "test plugin built for a future plugin API"};
  return &d;
}
void register_all(kiln::Registry& reg) { reg.add_stage("never_registered", nullptr); }
}  // namespace

KILN_PLUGIN(descriptor, register_all)
