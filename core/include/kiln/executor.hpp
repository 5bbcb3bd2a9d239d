// Memory planning and execution of a static graph on one device.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/data.hpp"
#include "kiln/graph.hpp"
#include "kiln/step.hpp"

namespace kiln {

struct OpDesc;

// Where a tensor's storage lives. Persistent tensors have their own allocations; the rest share regions.
enum class Region : uint8_t { none, persistent, gradients, arena, input, workspace };

struct MemoryPlan {
  std::vector<Region> region;  // per tensor (aliases: their root's)
  std::vector<size_t> offset;  // per tensor root: offset inside its region
  size_t persistent_by_tag[kMemoryTagCount] = {};
  size_t gradients = 0;              // one region holding every parameter gradient, in backward order
  size_t arena = 0;                  // activations and backward intermediates, overlapped by liveness
  size_t input = 0;                  // the batch's features and labels, all input slots
  size_t input_slot = 0;             // one slot (input = input_slots x input_slot)
  size_t workspace = 0;              // the largest per-op scratch the device asks for
  size_t activations_unplanned = 0;  // sum of arena tensors without reuse (what liveness saved against)
  // Work the arena placement did (tensor comparisons and free-list updates): tests check it grows near-linearly
  // with the model's depth, without timing anything.
  size_t placement_steps = 0;
  DevicePlan summary(const std::string& label) const;
};

struct PlanOptions {
  int device = 0;                    // plan only tensors and nodes of this device index
  std::vector<TensorId> keep_alive;  // tensors whose storage must survive to the end of the step
  size_t alignment = 256;
  int input_slots = 1;  // 2: double-buffered input, the next batch uploads while this step runs
};

// Arena tensors up to this count are placed greedily by size (tightest, quadratic); more by a sweep in step order.
inline constexpr size_t kGreedyPlacementMax = 4096;

// Liveness-based plan. `dev` (may be null) is asked for per-op workspace sizes.
MemoryPlan plan_memory(const Graph& g, Device* dev, const PlanOptions& o = {});

// Bytes an allocator with this alignment actually takes for `bytes`.
inline size_t aligned_size(size_t bytes, size_t alignment = 256) {
  return std::max(alignment, (bytes + alignment - 1) / alignment * alignment);
}

// Persistent tensors (parameters, optimizer state, EMA) and the shared scratch regions of one device. Several
// graphs (training, evaluation, other batch sizes) run against one DeviceState.
class DeviceState {
 public:
  DeviceState(DeviceContext ctx, uint32_t seed) : ctx_(ctx), seed_(seed) {}
  // Another copy of the step's scratch on the same device (pipeline micro-batches): the persistent tensors and
  // the workspace are `owner`'s, the gradients, arena and input regions its own. `owner` must outlive it.
  explicit DeviceState(DeviceState& owner) : ctx_(owner.ctx_), seed_(owner.seed_), owner_(&owner) {}

  // Allocates and initializes every persistent tensor of `g` that does not exist yet.
  void ensure_persistent(const Graph& g, int device_index);
  // Grows the shared regions to at least these sizes (bumps generation() when anything moved).
  void reserve_regions(const MemoryPlan& p);
  const BufferView& persistent(const std::string& name) const;
  bool has(const std::string& name) const { return owner_ ? owner_->has(name) : persistent_.count(name) != 0; }
  BufferView region(Region r) const;
  // Changes whenever a region this state uses moved (its own or, for a micro-batch state, its owner's).
  uint64_t generation() const { return generation_ + (owner_ ? owner_->generation() : 0); }
  DeviceContext& context() { return ctx_; }
  std::map<std::string, HostTensor> read_all();
  void write(const std::string& name, const HostTensor& t);  // throws Error on unknown name or shape mismatch

 private:
  struct Entry {
    Allocation mem;
    Shape shape;
  };
  DeviceContext ctx_;
  uint32_t seed_;
  std::map<std::string, Entry> persistent_;
  Allocation gradients_, arena_, input_, workspace_;
  uint64_t generation_ = 0;
  DeviceState* owner_ = nullptr;
};

// The device time of each op over the steps an Executor ran while the profile was attached (Executor::set_profile):
// every op, or group of ops a backend fuses, is followed by Device::synchronize, so each time is the device's own and
// a profiled step runs somewhat slower than an unprofiled one. Keyed by op name; a fused group as "conv2d+relu".
struct OpProfile {
  struct Entry {
    double seconds = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Entry> ops;
};

// Runs one graph's nodes for device `device_index` against a DeviceState. Calls are bound once (a flat array of
// prepared OpCalls); per-step scalars (learning rate, Adam's t, dropout counters) are patched in place.
class Executor {
 public:
  Executor(Graph g, DeviceState& state, const PlanOptions& o = {});

  // Copies features and labels into input slot `slot` (synchronously, in order with the device's ops).
  void load_batch(const Element& batch, int slot = 0);
  // Starts copying them into `slot` through Device::upload_async; returns the tickets to wait on.
  std::vector<uint64_t> upload_batch(const Element& batch, int slot);
  void run(const StepScalars& s, int slot = 0);  // all nodes, reading the batch in input slot `slot`
  // Runs nodes [begin, end) (strategies that interleave communication with compute).
  void run_range(size_t begin, size_t end, const StepScalars& s, int slot = 0);
  int input_slots() const { return opts_.input_slots; }
  // Times every op of the runs that follow into `p` (nullptr: stop); for measurements (kiln_step_bench --profile).
  void set_profile(OpProfile* p) { profile_ = p; }
  size_t first_node_of(Phase p) const;  // index of the first node of a phase (size() when none)
  size_t size() const { return node_index_.size(); }
  float read_scalar(TensorId t);
  HostTensor read(TensorId t);
  // Overwrites tensor t with `h` (same element count), in order with the device's ops: what a node's kernel would
  // write (data_parallel's synchronized batch norm computes some nodes across replicas on the host).
  void write(TensorId t, const HostTensor& h);
  BufferView view(TensorId t, int slot = 0) const;
  const Graph& graph() const { return g_; }
  const MemoryPlan& plan() const { return plan_; }

 private:
  void bind();
  void patch(const StepScalars& s);
  Graph g_;
  DeviceState& state_;
  PlanOptions opts_;
  MemoryPlan plan_;
  void check_batch(const Element& b) const;
  std::vector<std::vector<OpCall>> calls_;                 // per input slot
  size_t input_stride_ = 0;                                // bytes between input slots (set by bind())
  std::vector<size_t> node_index_;                         // calls_[i] runs g_.nodes()[node_index_[i]]
  std::vector<std::pair<size_t, const OpDesc*>> patches_;  // calls whose op reads per-step scalars
  uint64_t bound_generation_ = ~0ull;
  int64_t patched_step_ = -1;
  float patched_lr_ = -1.f;
  float patched_scale_ = -1.f;
  OpProfile* profile_ = nullptr;
};

// Runs the forward pass of training graph `g` for `batch` on `state`, keeping every layer output, and returns the
// first layer (in model order) with a non-finite output as "name (type)", or "" (used after a non-finite loss).
std::string first_nonfinite_layer(Graph g, DeviceState& state, const Element& batch, int64_t step);

}  // namespace kiln
