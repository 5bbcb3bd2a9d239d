// A run's position inside an epoch, saved in a mid-epoch checkpoint (Checkpoint::data_state) so that a resumed run
// continues with exactly the batches the stopped one would have trained on (trainer.cpp writes and reads it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data.hpp"

namespace kiln {

// Where a run stopped inside an epoch: the epoch's running sums, the train pipeline's saved state, and the batch the
// pipeline had already delivered (one batch of lookahead) but no step had used yet.
struct Position {
  int64_t batches = 0, examples = 0, norms = 0;
  double loss_sum = 0, norm_sum = 0;
  std::vector<double> head_sum;
  StageState pipeline;
  std::optional<Element> pending;
};

// The position as the checkpoint stores it, and back; a damaged or foreign one is a DataError naming `path`.
std::vector<uint8_t> encode_position(const Position& p);
Position decode_position(const std::vector<uint8_t>& b, const std::string& path);

}  // namespace kiln
