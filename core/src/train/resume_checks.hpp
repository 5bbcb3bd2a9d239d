// What a resume checks before it loads anything (the trainer): the text source's vocabulary against the run's
// vocab.json, and the checkpoint's header and tensors against the run. Each throws DataError naming the file and
// what differs; nothing on disk has changed when it does.
#pragma once
#include <cstdint>
#include <string>

namespace kiln {

class Session;
class Runner;
struct Checkpoint;

// The [data.train] text source's vocabulary against <output_dir>/vocab.json (nothing to check without either).
void check_resume_vocabulary(const Session& s);

// The run continues only with the model, data and optimizer it was started with: the vocabulary, then the resolved
// config against <output_dir>/config.toml (ConfigError listing every key that differs and may not change).
void check_resume_config(const Session& s, const std::string& output_dir);

// `c`, read from `path`, against the run: its epoch and step against [train] epochs and the steps those epochs have
// (`per_epoch` batches an epoch, -1 when unknown; `size_hint` the train pipeline's examples per epoch), and its
// tensors against the runner's own state (names and shapes: optimizer state and EMA included).
void check_checkpoint_fits(const Session& s, Runner& runner, const Checkpoint& c, const std::string& path,
                           int64_t per_epoch, int64_t size_hint);

}  // namespace kiln
