// ZeRO stage 1 for data_parallel: the optimizer state is split by elements over the replicas. Each replica keeps
// the state of its contiguous share of the (flattened) parameters, updates only that share with the averaged
// gradients, and broadcasts the updated weights of its share to the other replicas.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/executor.hpp"
#include "kiln/strategy.hpp"

namespace kiln::parallel {

// How one parameter is updated, as the unsharded graph does it.
struct ParamUpdate {
  std::string name;  // "dense_1.kernel"
  Shape shape;
  OpKind kind{};                         // SgdUpdate, AdamUpdate, RmspropUpdate
  OpAttrs attrs;                         // count is set per slice
  std::vector<std::string> state_names;  // "dense_1.kernel/adam_m", ...; empty entries: the op's unused buffer
};

// Elements [offset, offset + count) of parameter `param` (index into ShardLayout::params).
struct ShardSlice {
  size_t param = 0;
  int64_t offset = 0, count = 0;
};

struct ShardLayout {
  std::vector<ParamUpdate> params;              // in the order backward produces their gradients
  std::vector<std::vector<ShardSlice>> slices;  // per rank
  int64_t total_elements = 0;
  size_t state_tensors = 0;  // per element (adam 2, sgd+momentum 1, ...)
  // Bytes of optimizer state rank `r` keeps (each slice's buffers aligned like the allocator's).
  size_t state_bytes(int r) const;
  int64_t elements(int r) const;
};

// Splits the parameters of `training_graph` (built with its optimizer updates) evenly by elements over `ranks`;
// cuts fall on multiples of 64 elements inside a parameter, so every slice starts 256-byte aligned.
ShardLayout make_shard_layout(const Graph& training_graph, int ranks);

// Removes every optimizer update from a training graph (the sharded optimizer runs them) so its state is neither
// planned nor allocated; keeps EMA updates, moved after everything else.
void strip_optimizer_updates(Graph& g);

// One replica's share: its state buffers and the update of its slices.
class ShardedOptimizer {
 public:
  ShardedOptimizer(const ShardLayout& layout, int rank, DeviceContext dctx);
  // Updates this replica's slices of the weights in place, reading the (averaged) gradients through `ex`.
  void update(const Executor& ex, const StepScalars& s);
  // The weights of slice `sl` in a replica's state (what the slice's owner broadcasts after its update).
  static BufferView weight_slice(const ShardLayout& layout, const DeviceState& state, const ShardSlice& sl);
  // Writes this replica's slices of every state tensor into `out` (full-size tensors, created on first use).
  void gather(std::map<std::string, HostTensor>& out);
  // Reads this replica's slices from `in`; returns the state names it consumed.
  std::vector<std::string> scatter(const std::map<std::string, HostTensor>& in);

 private:
  BufferView state_view(size_t slice, size_t k) const;
  const ShardLayout& layout_;
  int rank_;
  DeviceContext dctx_;
  std::vector<Allocation> state_;  // per state tensor kind: every slice's buffer, back to back
  std::vector<size_t> offset_;     // per slice: byte offset inside each state buffer
  std::map<const Executor*, std::vector<std::pair<TensorId, TensorId>>> ids_;  // per executor: (param, grad) per param
};

}  // namespace kiln::parallel
