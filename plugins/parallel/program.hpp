// A placed step graph cut into segments: maximal runs of nodes on one device (and one phase), each starting with
// the copies of the tensors it needs from other devices. Devices run their segments in order; a segment waits
// only for the segments that wrote the tensors it copies in.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kiln/graph.hpp"

namespace kiln::parallel {

// One copy of a tensor (its storage root) from the device that wrote it to a device that reads it.
struct Transfer {
  TensorId root = kNoTensor;
  int src = 0, dst = 0;  // slots (indices into the strategy's devices)
  size_t bytes = 0;
  size_t producer = 0;           // segment that wrote it
  Phase phase = Phase::forward;  // of the segment that reads it
  std::string from_layer, to_layer;
};

struct Segment {
  int slot = 0;
  Phase phase = Phase::forward;
  size_t begin = 0, end = 0;            // node range in the graph
  size_t call_begin = 0, call_end = 0;  // the same range in the slot's executor
  std::vector<size_t> pulls;            // transfers to do before it runs
};

struct Program {
  int slots = 0;
  std::vector<Segment> segments;
  std::vector<Transfer> transfers;
  // Per slot: tensors other devices copy from it; their storage must live until the end of the step, because the
  // copy happens whenever the reading device gets there.
  std::vector<std::vector<TensorId>> keep_alive;
  size_t bytes_per_step() const;
};

// Cuts `g` (nodes placed on slots 0..slots-1). Throws Error when a node reads a persistent tensor of another
// device (a layer's parameters must live where its ops run).
Program make_program(const Graph& g, int slots);

}  // namespace kiln::parallel
