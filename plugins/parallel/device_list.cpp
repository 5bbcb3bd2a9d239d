// Opening devices of further backends for mixed-backend strategies.
#include "device_list.hpp"

#include <set>

#include "kiln/error.hpp"

namespace kiln::parallel {

RunnerContext ExtraDevices::extend(const RunnerContext& ctx, const std::vector<DeviceEntry>& entries) {
  RunnerContext out = ctx;
  std::set<std::string> open_backends;
  for (const auto& d : ctx.devices) open_backends.insert(d.device->info().backend);
  for (const auto& e : entries) {
    if (e.label.empty()) continue;
    const auto colon = e.label.find(':');
    const std::string backend = e.label.substr(0, colon);
    if (open_backends.count(backend)) continue;  // resolve_devices reports a device that is not open
    if (!devices_.count(e.label)) {
      if (!reg_ || !reg_->has_backend(backend)) {
        std::string known;
        if (reg_)
          for (const auto& b : reg_->backend_names()) known += (known.empty() ? "" : ", ") + b;
        throw ConfigError(where_ + " lists \"" + e.label + "\", but no backend \"" + backend + "\" is loaded" +
                          (known.empty() ? "" : " (loaded: " + known + ")"));
      }
      int index = -1;
      try {
        index = std::stoi(e.label.substr(colon + 1));
      } catch (const std::exception&) {
        throw ConfigError(where_ + ": \"" + e.label + "\" is not a device label of the form backend:index");
      }
      auto& b = backends_[backend];
      if (!b) b = reg_->backend(backend)(BackendOptions{});
      auto infos = b->enumerate();
      if (index < 0 || index >= static_cast<int>(infos.size())) {
        std::string why = b->unavailable_reason();
        throw ConfigError(where_ + " lists \"" + e.label + "\", but backend \"" + backend + "\" has " +
                          std::to_string(infos.size()) + " device(s)" + (why.empty() ? "" : ": " + why));
      }
      auto dev = b->open(index);
      AllocatorOptions ao;
      const size_t total = dev->info().total_memory;
      ao.limit = memory_limit_.empty() ? total : parse_memory_size(memory_limit_, total);
      if (ao.limit > total)
        throw ConfigError(where_ + ": memory_limit = \"" + memory_limit_ + "\" exceeds the " + format_bytes(total) +
                          " of " + e.label);
      allocators_[e.label] = std::make_unique<Allocator>(*dev, ao);
      devices_[e.label] = std::move(dev);
    }
    bool present = false;
    for (const auto& d : out.devices) present = present || d.device == devices_.at(e.label).get();
    if (!present) out.devices.push_back({devices_.at(e.label).get(), allocators_.at(e.label).get()});
  }
  return out;
}

}  // namespace kiln::parallel
