// Checkpoint files (docs/checkpoint.md): what a run saves after each epoch (and mid-epoch), and what --resume,
// `kiln evaluate`, `kiln predict` and `kiln export` read back. Separate from trainer.hpp so that code reading a
// checkpoint does not depend on the training loop.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/tensor.hpp"

namespace kiln {

// Checkpoint file: parameters, optimizer state, EMA and the training position. Written atomically.
struct Checkpoint {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // global steps completed
  // Empty at an epoch's end. Mid-epoch: the position inside epoch `epoch` (0-based) that a resumed run continues
  // from: the train pipeline's saved state, the batch it had already delivered, and the epoch's running sums.
  std::vector<uint8_t> data_state;
  std::map<std::string, HostTensor> tensors;
};
// keep > 1: the checkpoint that `path` held is kept as <stem>-step<N>.kiln beside it; keep >= 1: of those kept
// files, only the newest keep - 1 stay (keep = 0: they are left alone).
void save_checkpoint(const std::string& path, const Checkpoint& c, int64_t keep = 0);
Checkpoint load_checkpoint(const std::string& path);  // throws DataError naming the file and what is wrong

// `path` (if it exists), then its kept earlier checkpoints, newest first.
std::vector<std::string> checkpoint_files(const std::string& path);
// The newest of checkpoint_files(path) that loads. When newer ones are damaged they are renamed <name>.damaged and
// `warning` names them and the file used; throws DataError listing every file's fault when none loads.
struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::string path;
  std::string warning;
};
LoadedCheckpoint load_newest_checkpoint(const std::string& path);
void remove_checkpoints(const std::string& path);  // checkpoint_files(path), all of them

}  // namespace kiln
