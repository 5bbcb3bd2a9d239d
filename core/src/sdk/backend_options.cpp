// BackendOptions: the [device] table handed to a backend, and device type names.
#include "kiln/device.hpp"

namespace kiln {

std::string_view device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::gpu:
      return "gpu";
    case DeviceType::integrated_gpu:
      return "integrated_gpu";
    case DeviceType::virtual_gpu:
      return "virtual_gpu";
    case DeviceType::other:
      break;
  }
  return "other";
}

BackendOptions BackendOptions::parse(const std::string& keys) {
  return BackendOptions(*Config::load_string("[device]\n" + keys + "\n", "<backend options>").root().table("device"));
}

BackendOptions::BackendOptions() : BackendOptions(parse("")) {}

}  // namespace kiln
