// The "data_parallel" strategy: [strategy] keys, the per-replica memory plan, and the checks before any step.
#include <algorithm>
#include <sstream>

#include "data_parallel.hpp"
#include "device_list.hpp"
#include "host_communicator.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "replica.hpp"
#include "sharded_optimizer.hpp"

namespace kiln::parallel {

namespace {

std::string share_text(int64_t rows, int64_t total) {
  std::ostringstream os;
  os << rows << "/" << total;
  return os.str();
}

}  // namespace

std::vector<DevicePlan> plan_data_parallel(const DataParallelOptions& o, const RunnerContext& ctx) {
  auto dev = resolve_devices(o.devices, ctx.devices, o.where_devices);
  const int local = static_cast<int>(dev.size());
  // NCCL joins CUDA devices only: say so while planning (and in `kiln plan`), not when the communicator is made.
  if (o.communicator == "nccl")
    for (size_t r = 0; r < dev.size(); ++r) {
      const DeviceInfo& info = ctx.devices.at(static_cast<size_t>(dev[r])).device->info();
      if (info.backend != "cuda")
        throw ConfigError(o.where_communicator + ": communicator = \"nccl\" joins CUDA devices only, but replica " +
                          std::to_string(r) + " runs on " + info.label() + " (backend \"" + info.backend +
                          "\"); expected [device] backend = \"cuda\". On other devices use communicator = \"host\" in "
                          "one process, or communicator = \"mpi\" across processes");
    }
  const int first = group_rank(o) * local;  // this process's first replica among every process's
  const int n = group_size(o) * local;      // replicas of every process
  if (ctx.global_batch < n)
    throw ConfigError(o.where + ": [train] batch_size = " + std::to_string(ctx.global_batch) + " is smaller than the " +
                      std::to_string(n) + " replicas; every replica needs at least one example per step");
  if (ctx.global_batch % n != 0 && !o.uneven)
    throw ConfigError(o.where + ": [train] batch_size = " + std::to_string(ctx.global_batch) +
                      " does not split evenly over " + std::to_string(n) + " replicas; use a multiple of " +
                      std::to_string(n) + " (" + std::to_string(ctx.global_batch / n * n) + " or " +
                      std::to_string((ctx.global_batch / n + 1) * n) +
                      "), or set uneven = true to give replicas different shares and weight their gradients by them");
  // Sharded updates run outside the graph's update phase, so the clipping nodes would run after them.
  if (o.sharded && ctx.optimizer && ctx.optimizer->clip_norm > 0)
    throw ConfigError(o.where +
                      ": optimizer_state = \"sharded\" does not support [optimizer] clip_norm yet (each replica "
                      "updates only its slices); use optimizer_state = \"replicated\" (the default), which clips the "
                      "all-reduced gradient, or remove clip_norm");
  auto all_rows = split_rows(ctx.global_batch, n);
  std::vector<int64_t> rows(all_rows.begin() + first, all_rows.begin() + first + local);
  bool overlap = o.overlap;  // the runner reduces after backward unless every device is host memory
  for (int d : dev) overlap = overlap && ctx.devices.at(static_cast<size_t>(d)).device->info().host_addressable;
  std::unique_ptr<ShardLayout> layout;
  if (o.sharded)
    layout = std::make_unique<ShardLayout>(make_shard_layout(replica_graph(ctx, rows[0], true, false, false), n));
  std::vector<DevicePlan> out;
  for (int r = 0; r < local; ++r) {
    Device* d = ctx.devices.at(static_cast<size_t>(dev[static_cast<size_t>(r)])).device;
    Graph train = replica_graph(ctx, rows[static_cast<size_t>(r)], true, false, o.sharded);
    Graph eval = replica_graph(ctx, rows[static_cast<size_t>(r)], false, false, o.sharded);
    PlanOptions po;
    po.input_slots = std::max(1, ctx.input_slots);  // double-buffered input ([train] device_prefetch)
    MemoryPlan pt = plan_memory(train, d, po), pe = plan_memory(eval, d);
    auto buckets = make_buckets(train, pt, o.bucket_bytes);
    pt.arena = std::max(pt.arena, pe.arena);
    pt.workspace = std::max(pt.workspace, pe.workspace);
    pt.input = std::max(pt.input, pe.input);
    DevicePlan p = pt.summary(d->info().label());
    if (po.input_slots > 1)
      p.notes.push_back("input buffers: " + std::to_string(po.input_slots) +
                        " batches ([train] device_prefetch: the next batch is copied in while the step runs)");
    p.notes.push_back("data_parallel replica " + std::to_string(first + r) + " of " + std::to_string(n) + ": batch " +
                      std::to_string(rows[static_cast<size_t>(r)]) + " of " + std::to_string(ctx.global_batch) +
                      " (gradient weight " + share_text(rows[static_cast<size_t>(r)], ctx.global_batch) + ")");
    p.notes.push_back("gradient all-reduce: " + bytes_text(pt.gradients) + " per step in " +
                      std::to_string(buckets.size()) + " bucket(s) of about " + bytes_text(o.bucket_bytes) +
                      " through the \"" + o.communicator + "\" communicator, " +
                      (overlap ? "overlapped with backward" : "after backward"));
    if (layout) {
      const int g = first + r;
      p.optimizer_state += layout->state_bytes(g);
      p.notes.push_back("optimizer state sharded (ZeRO stage 1): this replica keeps the state of " +
                        std::to_string(layout->elements(g)) + " of " + std::to_string(layout->total_elements) +
                        " weights in " + std::to_string(layout->slices[static_cast<size_t>(g)].size()) +
                        " slice(s), updates them and broadcasts them");
    } else {
      p.notes.push_back("optimizer state replicated: every replica updates every parameter");
    }
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

class DataParallelStrategy final : public Strategy {
 public:
  DataParallelStrategy(const ConfigNode& c, const Registry* reg) : reg_(reg) {
    o_.where = c.where();
    o_.where_devices = c.has("devices") ? c.where("devices") : c.where();
    o_.devices = parse_device_list(c, "devices");
    o_.uneven = c.get_bool("uneven", false);
    auto bucket = c.get_size_text("bucket_size", "1MiB");
    try {
      o_.bucket_bytes = parse_memory_size(bucket, 0);
    } catch (const ConfigError& e) {
      c.fail("bucket_size", std::string(e.what()) + " (expected a size such as \"1MiB\" or a byte count)");
    }
    if (o_.bucket_bytes == 0) c.fail("bucket_size", "expected a positive size such as \"1MiB\"");
    o_.overlap = c.get_bool("overlap", true);
    o_.concurrent = c.get_bool("concurrent", true);
    o_.sharded = c.get_choice("optimizer_state", {"replicated", "sharded"}, "replicated") == "sharded";
    o_.communicator = c.get_string("communicator", "host");
    o_.where_communicator = c.has("communicator") ? c.where("communicator") : c.where();
    o_.timeout_s = c.get_float("timeout_s", 60.0);
    if (!(o_.timeout_s > 0))
      c.fail("timeout_s", "expected a positive number of seconds, found " + std::to_string(o_.timeout_s));
    o_.fixed_order = c.get_choice("reduction", {"fast", "fixed_order"}, "fast") == "fixed_order";
    auto limit = c.get_size_text("memory_limit", "");
    if (!limit.empty()) {
      try {
        parse_memory_size(limit, size_t{1} << 40);
      } catch (const ConfigError& e) {
        c.fail("memory_limit", e.what());
      }
    }
    extra_ = std::make_shared<ExtraDevices>(reg, limit, o_.where_devices);
    const bool names_group = o_.communicator != "host" && reg_ && reg_->has_process_group(o_.communicator);
    if (c.has("process_group")) {
      // Across processes with a communicator of its own that spans them (NCCL), the group only carrying its setup.
      o_.process_group = c.get_string("process_group");
      const std::string& g = o_.process_group;
      if (!(reg_ && reg_->has_process_group(g)))
        c.fail("process_group",
               "no process group \"" + g + "\" is registered; \"mpi\" comes with the mpi plugin " +
                   "(libkiln_mpi), which is built when CMake finds MPI: install OpenMPI (Debian: apt-get " +
                   "install openmpi-bin libopenmpi-dev) and rebuild Kiln; `kiln plugins` says why a plugin " +
                   "failed to load");
      if (o_.communicator == "host")
        c.fail("communicator", "expected a communicator that spans the processes of process_group = \"" + g +
                                   "\", found \"host\", which reduces inside one process; use communicator = \"" + g +
                                   "\" (through host memory, any backend) or \"nccl\" (CUDA devices)");
      if (names_group && o_.communicator != g)
        c.fail("communicator", "names the process group \"" + o_.communicator + "\" but process_group = \"" + g +
                                   "\"; expected the same group in both, or a communicator such as \"nccl\"");
      if (!names_group && !reg_->has_group_communicator(o_.communicator))
        c.fail("communicator",
               "expected a communicator that spans the processes of process_group = \"" + g + "\", found \"" +
                   o_.communicator + "\", which " +
                   (reg_->has_communicator(o_.communicator) ? "reduces inside one process only" : "is not registered") +
                   "; use communicator = \"" + g + "\" (through host memory, any backend) or \"nccl\" " +
                   "(CUDA devices; the cuda plugin built with NCCL, `kiln plugins` lists \"communicator " +
                   "nccl across processes\")");
    } else if (names_group) {
      o_.process_group = o_.communicator;  // communicator = "mpi": the group and its own (hierarchical) communicator
    } else if (o_.communicator != "host" && !(reg_ && reg_->has_communicator(o_.communicator))) {
      c.fail("communicator",
             "no communicator \"" + o_.communicator + "\" is registered; \"host\" (in-process, any backend) " +
                 "always is, \"nccl\" comes with the cuda plugin, \"mpi\" with the mpi plugin (libkiln_mpi), "
                 "which is built when CMake finds MPI: install OpenMPI (Debian: apt-get install openmpi-bin "
                 "libopenmpi-dev) and rebuild Kiln; `kiln plugins` says why a plugin failed to load");
    }
    if (o_.fixed_order && !o_.process_group.empty() && o_.communicator != o_.process_group)
      c.fail("reduction",
             "\"fixed_order\" sums in rank order through the process group's own communicator (communicator = \"" +
                 o_.process_group + "\"); communicator = \"" + o_.communicator +
                 "\" picks its own order: expected reduction = \"fast\" (the default) with it");
    c.finish();
    if (!o_.process_group.empty()) {
      ProcessGroupOptions po;
      po.timeout_s = o_.timeout_s;
      po.fixed_order = o_.fixed_order;
      o_.group = reg_->process_group(o_.process_group)(po);  // MPI_Init: every rank of the run takes part from here on
    }
  }

  ProcessGroup* process_group() const override { return o_.group.get(); }

  std::string name() const override { return "data_parallel"; }
  int device_count(int visible) const override { return devices_to_open(o_.devices, visible); }
  std::vector<DevicePlan> plan(const RunnerContext& ctx) const override {
    return plan_data_parallel(o_, extra_->extend(ctx, o_.devices));
  }

  std::unique_ptr<Runner> create(const RunnerContext& host_ctx) override {
    const RunnerContext ctx = extra_->extend(host_ctx, o_.devices);
    auto plans = plan_data_parallel(o_, ctx);  // validates the devices and the batch split before anything is allocated
    auto dev = resolve_devices(o_.devices, ctx.devices, o_.where_devices);
    std::vector<Device*> devices;
    for (size_t r = 0; r < dev.size(); ++r) {
      const auto& dc = ctx.devices.at(static_cast<size_t>(dev[r]));
      devices.push_back(dc.device);
      if (plans[r].total() > dc.allocator->limit())
        throw OutOfMemory("data_parallel: replica " + std::to_string(r) + " needs " + format_bytes(plans[r].total()) +
                              " on " + plans[r].device + " but its memory limit is " +
                              format_bytes(dc.allocator->limit()) + " (parameters " +
                              format_bytes(plans[r].parameters) + ", gradients " + format_bytes(plans[r].gradients) +
                              ", optimizer state " + format_bytes(plans[r].optimizer_state) + ", activations " +
                              format_bytes(plans[r].activations) +
                              "). Nothing was allocated. Try optimizer_state = \"sharded\", "
                              "more replicas or a smaller batch; `kiln plan` shows the breakdown.",
                          plans[r].total(), {});
    }
    std::unique_ptr<Communicator> comm;
    if (o_.communicator == "host")
      comm = std::make_unique<HostCommunicator>(devices);
    else if (o_.group && o_.communicator == o_.process_group)
      comm = o_.group->communicator(devices);
    else if (o_.group)
      comm = reg_->group_communicator(o_.communicator)(devices, *o_.group);  // e.g. NCCL over every rank
    else
      comm = reg_->communicator(o_.communicator)(devices);
    return make_data_parallel_runner(o_, ctx, std::move(comm), extra_);
  }

 private:
  const Registry* reg_;
  DataParallelOptions o_;
  std::shared_ptr<ExtraDevices> extra_;  // shared with the runners, which use its devices
};

}  // namespace

void register_data_parallel(Registry& reg) {
  const Registry* r = &reg;
  reg.add_strategy("data_parallel", [r](const ConfigNode& c) -> std::unique_ptr<Strategy> {
    return std::make_unique<DataParallelStrategy>(c, r);
  });
}

}  // namespace kiln::parallel
