// Memory savers: exact in-place ops and recomputation of chosen layers (gradient checkpointing), as graph-level
// decisions the planner and the executor follow. Liveness-based reuse of the activation arena is always on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/graph.hpp"

namespace kiln {

struct PlanOptions;

enum class RecomputeMode : uint8_t { none, auto_, layers };

struct MemorySavers {
  // Ops whose contract says "may alias" (bias add, activations, dropout, their backward passes, add, scale) write
  // over their input when nothing reads that input later. Exact: the same arithmetic on the same values.
  // Off by default ([memory] inplace = true switches it on; memory_policy = "fit" turns it on when needed).
  bool inplace = false;
  // Recomputation: the forward outputs of these layers are not kept for backward; backward recomputes them from
  // the nearest kept layer output just before it needs them. "auto" keeps every `checkpoint_every`-th layer's
  // output; with checkpoint_every = 0 it tries spacings around sqrt(layers) and keeps the one whose planned
  // activation arena is smallest (no recomputation at all when none is smaller).
  RecomputeMode recompute = RecomputeMode::none;
  std::vector<std::string> recompute_layers;
  int64_t checkpoint_every = 0;
  std::string describe() const;  // "in-place on, recompute off" / "..., recompute auto (every 5th layer kept)"
};

// Applies `s` to a graph from build_graph: records the in-place choice for the planner and, for a training graph,
// duplicates the forward nodes of recomputed layers just before the first backward node that reads their outputs,
// so the originals die at the end of forward. Throws ConfigError for a recompute layer the graph does not have.
void apply_memory_savers(Graph& g, const MemorySavers& s, bool training);

// The layers `s` recomputes in training graph `g` (resolves "auto" by planning the candidates).
std::vector<std::string> recompute_layer_list(const Graph& g, const MemorySavers& s);

// Lifetimes of a graph's storage on one device, after in-place merging. Indexed by tensor id; only storage roots
// (rep[t] == t) carry meaningful first/last.
struct Liveness {
  std::vector<size_t> first, last;  // node indices; first == SIZE_MAX when never written here
  std::vector<bool> used;
  std::vector<int32_t> rep;  // the storage class of each root (in-place chains share one)
};
Liveness analyze_liveness(const Graph& g, const PlanOptions& o);

}  // namespace kiln
