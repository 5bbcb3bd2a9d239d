// kiln devices: every backend's devices with hardware id, memory, the processes the driver reports, and the
// reservations other Kiln jobs hold on them.
#include <iostream>

#include "commands.hpp"
#include "kiln/allocator.hpp"
#include "kiln/reservation.hpp"

namespace kiln::app {

int cmd_devices(const Options& o) {
  PluginLoader loader;
  Registry reg = Registry::with_builtins();
  load_plugins(o, loader, reg);
  const std::string root = reservation_root();
  for (const auto& name : reg.backend_names()) {
    if (!o.backend.empty() && name != o.backend) continue;
    auto b = reg.backend(name)(BackendOptions{});
    auto list = b->enumerate();
    std::cout << "backend " << name << " (auto priority " << b->priority() << "): " << list.size() << " device(s)";
    if (list.empty()) std::cout << " (" << b->unavailable_reason() << ")";
    std::cout << "\n";
    for (const auto& d : list) {
      std::cout << "  " << d.label() << "  " << d.name << "\n"
                << "      " << device_type_name(d.type) << (d.host_addressable ? " (host memory)" : "")
                << ", hardware id " << d.hardware_id << ", memory " << format_bytes(d.free_memory) << " free of "
                << format_bytes(d.total_memory) << "\n";
      for (const auto& p : d.processes) std::cout << "      used by " << p << "\n";
      auto holders = live_reservations(d.hardware_id, root);
      if (!holders.empty()) {
        size_t promised = total_bytes(holders);
        std::cout << "      reserved by Kiln jobs: " << format_bytes(promised)
                  << " (unreserved: " << format_bytes(d.total_memory > promised ? d.total_memory - promised : 0)
                  << ")\n"
                  << format_holders(holders);
      }
    }
  }
  std::cout << "reservations: " << (root.empty() ? "off (KILN_RESERVATION_DIR=off)" : root) << "\n";
  return 0;
}

}  // namespace kiln::app
