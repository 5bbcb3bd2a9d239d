// The epoch's last partial batch against the layers that cannot train on it, checked before step 1 (the trainer).
#pragma once
#include <cstdint>

namespace kiln {

class Session;

// Refuses (ConfigError with the sizes and the fixes) a training run whose epochs end in a partial batch the model
// cannot train on, e.g. one example through batch norm. `examples`: the train pipeline's examples per epoch
// (Stage::size_hint; -1 when a stage cannot tell, and then nothing is checked).
void check_last_batch(const Session& s, int64_t examples);

}  // namespace kiln
