// The parallel plugin: the data_parallel and model_parallel strategies and the in-process "host" communicator.
#include "kiln/plugin.hpp"

#include "data_parallel.hpp"
#include "host_communicator.hpp"
#include "model_parallel.hpp"

namespace kiln::parallel {

namespace {

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{
      "parallel", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT,
      "strategies data_parallel (replicas, bucketed gradient all-reduce, sharded optimizer "
      "state) and model_parallel (layer placement, pipeline micro-batches); host communicator"};
  return &d;
}

void register_all(Registry& reg) {
  register_data_parallel(reg);
  register_model_parallel(reg);
  reg.add_communicator("host", [](std::span<Device* const> devices) -> std::unique_ptr<Communicator> {
    return std::make_unique<HostCommunicator>(devices);
  });
}

}  // namespace
}  // namespace kiln::parallel

KILN_PLUGIN(kiln::parallel::descriptor, kiln::parallel::register_all)
