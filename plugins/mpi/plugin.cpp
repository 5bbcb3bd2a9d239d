// The mpi plugin: the "mpi" process group for data_parallel across processes and hosts (mpirun -np N kiln train).
#include "kiln/plugin.hpp"

#include "mpi_group.hpp"

namespace kiln::mpi {

namespace {

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{
      "mpi", KILN_VERSION_STRING, kApiVersion, KILN_BUILD_FINGERPRINT,
      "process group mpi: data_parallel across MPI ranks (hierarchical gradient all-reduce, "
      "optional fixed reduction order, collectives bounded by a timeout)"};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_process_group("mpi", [](const ProcessGroupOptions& o) -> std::shared_ptr<ProcessGroup> {
    return std::make_shared<MpiGroup>(o);
  });
}

}  // namespace
}  // namespace kiln::mpi

KILN_PLUGIN(kiln::mpi::descriptor, kiln::mpi::register_all)
