// strategy = { type = "data_parallel", devices = [...] }: the model replicated on every listed device, the global
// batch split over the replicas, gradients averaged (by share) through a Communicator in buckets while backward
// runs, and one optimizer update per replica (or per shard of the parameters, ZeRO stage 1 style).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "kiln/plugin.hpp"

namespace kiln::parallel {

struct DataParallelOptions {
  std::vector<DeviceEntry> devices;  // empty: every opened device
  bool uneven = false;               // a global batch that does not divide: weight each replica by its share
  size_t bucket_bytes = size_t{1} << 20;
  bool overlap = true;     // reduce each bucket as soon as every replica has produced it
  bool concurrent = true;  // one thread per replica (false: replicas run one after another)
  bool sharded = false;    // optimizer_state = "sharded"
  std::string communicator = "host";
  // A process group (communicator = "mpi", or process_group = "mpi" with a communicator that spans processes such as
  // "nccl"): the global batch is split over every replica of every process and this process runs replicas
  // rank * n .. rank * n + n - 1 of them. Null: this process alone.
  std::shared_ptr<ProcessGroup> group;
  std::string process_group;  // the group's name ("" without one); communicator == process_group: the group's own
  double timeout_s = 60;      // [strategy] timeout_s: a collective waiting longer is an error
  bool fixed_order = false;   // [strategy] reduction = "fixed_order"
  std::string where = "[strategy]";  // "run.toml:12: key 'strategy'", for errors
  std::string where_devices = "[strategy] devices";
  std::string where_communicator = "[strategy] communicator";
};

// Creates the Runner for these options (used by the strategy and by benchmarks).
// `keep` stays alive as long as the runner (devices the strategy opened itself).
std::unique_ptr<Runner> make_data_parallel_runner(const DataParallelOptions& o, const RunnerContext& ctx,
                                                  std::unique_ptr<Communicator> comm, std::shared_ptr<void> keep = {});
// Processes in the group and this process's rank (1 and 0 without a group).
inline int group_size(const DataParallelOptions& o) { return o.group ? o.group->size() : 1; }
inline int group_rank(const DataParallelOptions& o) { return o.group ? o.group->rank() : 0; }

std::vector<DevicePlan> plan_data_parallel(const DataParallelOptions& o, const RunnerContext& ctx);

// Registers "data_parallel". `reg` is consulted for communicators other than "host" and must outlive the strategies.
void register_data_parallel(Registry& reg);

}  // namespace kiln::parallel
