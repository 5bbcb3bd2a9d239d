// batch_norm with sync = true under data_parallel (PyTorch's SyncBatchNorm), used by the data-parallel runner.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/executor.hpp"

namespace kiln::parallel {

// Runs f(r) for every replica with rows in this step (on the replicas' lanes, in parallel where they run so).
using EachWithRows = std::function<void(const std::function<void(size_t)>&)>;
// Adds each value over every process of the group (nothing to do in one process).
using ReduceSums = std::function<void(std::vector<double>&)>;

// The synchronized batch norms among nodes [begin, end) of the replicas' training graphs, which share one node
// order: forward nodes (recomputed ones in backward too) and backward nodes.
std::vector<size_t> sync_batch_norm_nodes(const std::vector<Executor*>& ex, size_t begin, size_t end);

// Runs synchronized batch-norm node `node` (forward or backward) of every replica over the global batch and writes
// each replica's outputs; `rows` are each replica's rows of this step, `global` the rows of every process.
void sync_batch_norm(const std::vector<Executor*>& ex, const std::vector<int64_t>& rows, int64_t global, size_t node,
                     const EachWithRows& each_with_rows, const ReduceSums& reduce);

}  // namespace kiln::parallel
