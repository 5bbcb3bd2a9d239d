// A run spread over processes (Strategy::process_group): what the trainer checks and agrees on across ranks.
#pragma once
#include <string>

#include "kiln/config.hpp"
#include "kiln/data.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

// Throws ConfigError on every rank when a rank's resolved config differs from rank 0's, naming the first differing
// key, both values and the ranks' hosts. Collective.
void check_same_config(ProcessGroup& pg, const std::string& resolved_text, const std::string& file);

// What `pipeline` ([data.`split`] of `cfg`) will read, as this rank sees it: its example count and shapes, and for
// every file its source names (images, labels, path, files, dir) the size and a hash of its first and last MiB
// (file contents, not paths or times: ranks on other hosts or in other directories may resolve them differently).
std::string describe_data(const Config& cfg, const std::string& split, const Stage& pipeline);

// Throws DataError on every rank when a rank's describe_data differs from rank 0's, naming each differing rank, both
// hosts, what differs and the files as each resolved them. Collective.
void check_same_data(ProcessGroup& pg, const std::string& mine, const std::string& file);

// What every rank does after a step: stop when any rank got a stop signal (its number, else 0); checkpoint when
// rank 0's clock says one is due. Collective.
struct StepAgreement {
  int stop_signal = 0;
  bool checkpoint_due = false;
};
StepAgreement agree_after_step(ProcessGroup& pg, int stop_signal, bool checkpoint_due);

// After rank 0 wrote a checkpoint (`error`: empty, or why the write failed; the other ranks pass ""): no rank goes on
// before the file is whole, so a rank that exits after a stop cannot make mpirun end rank 0 during the write. Throws
// Error on the other ranks when rank 0's write failed. Collective.
void agree_checkpoint_written(ProcessGroup& pg, const std::string& error);

}  // namespace kiln
