// Strategies turn a model + devices into a Runner that executes training and evaluation steps.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/data.hpp"
#include "kiln/step.hpp"

namespace kiln {

class ConfigNode;
// A strategy reads the model through RunnerContext; its implementation includes kiln/model.hpp. The interface needs
// only the names, so the SDK's interfaces do not depend on how models are built.
struct ModelSpec;
struct OptimizerSpec;

struct StepResult {
  std::vector<float> losses;  // per output, weighted
  float total_loss = 0.f;
  float grad_norm = -1.f;  // [optimizer] clip_norm: the global gradient norm before clipping; -1 without clipping
  // float16's loss scaling: a gradient was not finite, so the step changed no weight (the scale backs off).
  bool skipped = false;
};

struct EvalResult {
  std::vector<float> losses;        // per output, summed over the batch's examples (not averaged)
  std::vector<HostTensor> outputs;  // per output: predictions/logits (N, ...)
};

// Executes steps. Parameters are identical on every replica after each step.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual StepResult train_step(const Element& batch, const StepScalars& s) = 0;
  // A hint that `next` is the batch of a coming train_step: the runner may start copying it to its device(s) now,
  // so that step does not wait on the transfer. `next` (the same object, or one moved from it) must stay alive
  // until that train_step. Default: nothing (train_step copies the batch itself).
  virtual void prefetch(const Element& next) { (void)next; }
  virtual EvalResult eval_batch(const Element& batch, bool use_ema) = 0;
  // Persistent state (parameters, optimizer state, EMA) by name, for checkpoints.
  virtual std::map<std::string, HostTensor> save_state() = 0;
  virtual void load_state(const std::map<std::string, HostTensor>& state) = 0;
  // First layer (in model order) whose forward output is non-finite for this batch, or "" (used after a NaN loss).
  virtual std::string find_nonfinite_layer(const Element& batch, int64_t step) = 0;
  virtual std::vector<DevicePlan> plan() const = 0;
  virtual std::string report() const { return {}; }  // placement and per-replica notes
  // A persistent tensor's live float32 values in host-addressable memory (the CPU backend's buffers), in the layout
  // save_state() gives it, for zero-copy views (the Python module's run.weights); empty where the runner keeps it
  // elsewhere (a GPU, several replicas, a packed or 16-bit layout). Valid while the runner lives; the host may
  // read and write it between steps.
  virtual std::span<float> host_view(const std::string& name) {
    (void)name;
    return {};
  }
};

struct RunnerContext {
  const ModelSpec* model = nullptr;
  const OptimizerSpec* optimizer = nullptr;
  std::vector<DeviceContext> devices;
  int64_t global_batch = 0;
  uint32_t seed = 0;
  // Input buffers per training step on a device: 2 when the trainer prefetches batches to the device
  // ([train] device_prefetch). Runners that implement Runner::prefetch plan and allocate that many.
  int input_slots = 1;
};

class ProcessGroup;

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // How many of the `visible` devices the host should open for this strategy.
  virtual int device_count(int visible) const {
    (void)visible;
    return 1;
  }
  // Memory plan only: nothing is allocated.
  virtual std::vector<DevicePlan> plan(const RunnerContext& ctx) const = 0;
  virtual std::unique_ptr<Runner> create(const RunnerContext& ctx) = 0;
  // The processes this strategy spans (e.g. MPI ranks), or null for a run inside this process alone. The trainer
  // lets rank 0 alone write the run's files and checks that every rank has the same config.
  virtual ProcessGroup* process_group() const { return nullptr; }
};

// Reads strategy-specific keys from the [strategy] table.
using StrategyFactory = std::function<std::unique_ptr<Strategy>(const ConfigNode& cfg)>;

// Collectives across devices (in-process ring, NCCL, MPI).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  // In-place sum over all ranks of `bufs[r]` (one buffer per device of this process, same byte size).
  virtual void all_reduce_sum(std::span<const BufferView> bufs, std::span<Device* const> devices) = 0;
  // `root` counts every device of every process: process p's local device r is p * size() + r (one process: the
  // local index).
  virtual void broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) = 0;
};

// Creates a communicator over these devices (all of one backend for NCCL; any mix for the host ring).
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(std::span<Device* const> devices)>;
// Creates a communicator over this process's `devices` that spans every process of `group` by itself (e.g. "nccl":
// one NCCL communicator over every GPU of every MPI rank, set up through the group's all_gather). Every process
// calls it with the same device count; process p's local device r is rank p * devices.size() + r, and size() is the
// local device count, as for ProcessGroup::communicator.
using GroupCommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(std::span<Device* const> devices, ProcessGroup& group)>;

// The processes of one run (MPI ranks), provided by a plugin and looked up by name ([strategy] communicator).
// Every collective must be called by every process in the same order; one that does not complete within the
// group's timeout throws Error naming this rank, the others and their hosts.
class ProcessGroup {
 public:
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string host() const = 0;  // this process's host name
  // Every process's bytes, in rank order (the sizes may differ).
  virtual std::vector<std::vector<uint8_t>> all_gather(std::span<const uint8_t> mine) = 0;
  // In-place sum over the processes, added in rank order: the same bits on every process.
  virtual void all_reduce_sum(std::span<float> values) = 0;
  // A communicator over this process's `devices` that spans every process: reduce inside the process, across the
  // processes, then back to every local device (hierarchical). Its size() is the local device count.
  virtual std::unique_ptr<Communicator> communicator(std::span<Device* const> devices) = 0;
};

struct ProcessGroupOptions {
  double timeout_s = 60;     // a collective waiting longer reports the missing ranks instead of hanging
  bool fixed_order = false;  // gradient sums in rank order (bitwise reproducible) instead of the library's order
};
using ProcessGroupFactory = std::function<std::shared_ptr<ProcessGroup>(const ProcessGroupOptions&)>;

}  // namespace kiln
