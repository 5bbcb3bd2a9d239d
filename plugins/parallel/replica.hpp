// One data-parallel replica: the whole model on one device, its persistent state and its executors per batch size.
// Also the gradient buckets the all-reduce works on.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/executor.hpp"
#include "kiln/input_slots.hpp"
#include "kiln/model.hpp"
#include "kiln/strategy.hpp"

namespace kiln::parallel {

// Moves EMA updates after every optimizer update (so they can run after a weights broadcast).
void move_ema_last(Graph& g);

// The step's graph for one replica: build_graph at `batch`; training graphs get their EMA updates last and, with a
// sharded optimizer, no optimizer updates at all (the ShardedOptimizer runs them).
Graph replica_graph(const RunnerContext& ctx, int64_t batch, bool training, bool ema, bool sharded);

// A contiguous byte range of the gradients region, complete once node `ready` (exclusive) has run.
struct Bucket {
  size_t begin = 0, end = 0;  // offsets in the gradients region
  size_t ready = 0;           // executor call index after which every gradient in it is final
  int tensors = 0;
};
// Groups gradients in the order backward produces them into buckets of at least `bucket_bytes` (the last may be
// smaller). Throws Error when a gradient is not in the gradients region.
std::vector<Bucket> make_buckets(const Graph& g, const MemoryPlan& p, size_t bucket_bytes);

class Replica {
 public:
  Replica(const RunnerContext& ctx, int device_index, int rank, bool sharded);

  Executor& executor(int64_t batch, bool training, bool ema);
  DeviceState& state() { return state_; }
  // Double-buffered input of the training executors ([train] device_prefetch: ctx.input_slots).
  InputSlots& input() { return input_; }
  Device& device() { return *dctx_.device; }
  std::string label() const { return dctx_.device->info().label(); }
  int rank() const { return rank_; }
  // The first non-finite layer output of a forward pass over `batch` (training mode), or "".
  std::string find_nonfinite_layer(const Element& batch, int64_t step);
  // Runs one op on this replica's device (scale or zero a bucket).
  void run_op(OpKind kind, float alpha, const BufferView& v);

 private:
  const RunnerContext& ctx_;
  DeviceContext dctx_;
  int rank_;
  bool sharded_;
  DeviceState state_;
  std::map<std::tuple<int64_t, bool, bool>, std::unique_ptr<Executor>> execs_;
  InputSlots input_;  // after state_ and execs_: destroyed first, it waits for uploads into them
};

}  // namespace kiln::parallel
