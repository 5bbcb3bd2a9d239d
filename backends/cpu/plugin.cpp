// The "cpu" plugin's entry: descriptor + registration of the backend.
#include "kiln/plugin.hpp"

#include <memory>
#include <optional>
#include <string>

#include "backend.hpp"
#include "cpu_kernel.hpp"
#include "kiln/error.hpp"

namespace kiln::cpu {

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{"cpu", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT,
                                  "CPU backend: kernels on its own thread pool, OpenBLAS sgemm, N logical devices"};
  return &d;
}

void register_all(Registry& reg) {
  for (const CpuKernelEntry& e : cpu_kernel_list()) {
    const std::optional<OpKind> kind = find_op(e.op);
    if (!kind)
      throw Error(std::string("cpu plugin: a kernel is registered for op '") + e.op + "', which no one registered");
    reg.add_kernel("cpu", *kind, e.kernel);
  }
  reg.add_backend("cpu",
                  [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<CpuBackend>(o); });
}

}  // namespace kiln::cpu

KILN_PLUGIN(kiln::cpu::descriptor, kiln::cpu::register_all)
