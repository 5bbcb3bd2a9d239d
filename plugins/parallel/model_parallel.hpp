// strategy = { type = "model_parallel" }: layers on different devices (each layer's `device`, or placement =
// "auto"), copies at device boundaries, and an optional GPipe-style pipeline of micro-batches.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "kiln/graph.hpp"
#include "kiln/plugin.hpp"
#include "program.hpp"

namespace kiln::parallel {

struct ModelParallelOptions {
  std::vector<DeviceEntry> devices;  // the slots; empty: every opened device
  bool auto_place = false;           // placement = "auto"
  int micro_batches = 1;
  bool concurrent = true;  // one thread per device
  std::string where = "[strategy]";
  std::string where_devices = "[strategy] devices";
};

// Where everything goes: the strategy's devices (slots) and the slot of every layer.
struct Placement {
  std::vector<int> open_index;  // per slot: index into RunnerContext::devices
  std::vector<int> layer_slot;  // per layer of the model, in model order
  int64_t micro_rows = 0;       // rows per micro-batch at the global batch
  int micro_batches = 1;
  bool automatic = false;
};

// Resolves the slots and the layers' devices (or places them automatically so every slot's plan fits its limit).
// ConfigError when a layer names a device that is not a slot, or when no placement fits.
Placement resolve_placement(const ModelParallelOptions& o, const RunnerContext& ctx);

// The step's graph with every node on its layer's slot.
Graph placed_graph(const RunnerContext& ctx, const Placement& p, int64_t rows, bool training, bool ema);

// Per slot: the memory of a pipelined step (micro_batches copies of the scratch regions) and the placement report
// in the notes (layers and ops, bytes copied in and out per step, pipeline bubble).
std::vector<DevicePlan> plan_model_parallel(const RunnerContext& ctx, const Placement& p, bool notes);

// Automatic placement: contiguous runs of layers (model order) per slot, balanced by memory, then checked with the
// planner. `fits(layer_slot)` returns per slot whether its plan fits. Returns an empty vector when nothing fits.
std::vector<int> auto_place(const RunnerContext& ctx, int slots, int micro_batches, int64_t micro_rows,
                            const std::function<std::vector<bool>(const std::vector<int>&)>& fits);

// `keep` stays alive as long as the runner (devices the strategy opened itself).
std::unique_ptr<Runner> make_model_parallel_runner(const ModelParallelOptions& o, const RunnerContext& ctx, Placement p,
                                                   std::shared_ptr<void> keep = {});
void register_model_parallel(Registry& reg);

}  // namespace kiln::parallel
