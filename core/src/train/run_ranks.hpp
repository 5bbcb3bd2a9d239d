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

// Rows [begin, end) of every full global batch of `batch` examples that this process's replicas train on, so its
// train pipeline reads only those (StageContext::rows_begin/rows_end). Under data_parallel across P processes rank r
// takes rows r * batch / P .. (r + 1) * batch / P: the replicas split a full batch evenly, which training requires
// unless [strategy] uneven = true. {0, 0} (every row) for one process, another strategy, uneven = true, a batch that
// P does not divide, or a [data.train] with a cache stage after its batch stage.
struct RowShare {
  int64_t begin = 0, end = 0;
  bool all() const { return end == 0; }
};
RowShare train_rows(const Config& cfg, const Strategy& strategy, int64_t batch);

// The whole batch `b` from every process's share of it (each filled only its rows): what a checkpoint saves as the
// batch already pulled, so any number of processes can resume from it. A smaller batch (an epoch's last, read whole
// by every process) is returned as it is. Collective.
Element gather_rows(ProcessGroup& pg, const Element& b, RowShare mine, int64_t batch);

// Every process's `mine`, in rank order. Collective.
std::vector<uint64_t> gather_counts(ProcessGroup& pg, uint64_t mine);

}  // namespace kiln
