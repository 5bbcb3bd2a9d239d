// A run's output directory belongs to one process and says what ran (trainer.cpp uses these; docs/user_guide.md,
// "The run directory").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

class Session;

// Where the run writes, validated before anything else happens: a run name is one path component (it becomes
// runs/<name>), an output directory is a directory. Returns the config key responsible for the directory, for
// later filesystem errors.
std::string check_output_dir(const Session& s);

// Creates the output directory `dir` (and its parents); an error names `key`, the config key it comes from.
void create_output_dir(const std::string& dir, const std::string& key);

// An exclusive lock on <dir>/.kiln.lock (flock), held while the object lives and released by the kernel when the
// process ends however it ends (so a killed run never leaves a stale lock). The file holds the holder's pid, start
// time and command. Throws Error naming the directory, `key` and the holder's pid when another process holds it.
class RunLock {
 public:
  RunLock(const std::string& dir, const std::string& key, const std::string& command);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// What an output directory already holds from an earlier run.
struct PriorRun {
  bool checkpoint = false;   // checkpoint.kiln exists
  int64_t metric_lines = 0;  // lines of metrics.jsonl
  bool exists() const { return checkpoint || metric_lines > 0; }
};
PriorRun inspect_run_dir(const std::string& dir);

// Keeps the records of metrics.jsonl whose "step" is at most `step` (a resumed run then writes each step and epoch
// once), replacing the file atomically. Returns how many records were dropped.
int64_t trim_metrics(const std::string& path, int64_t step);

// Writes <dir>/config.toml (the configuration as resolved, --set overrides applied) and <dir>/run.json (Kiln's
// version, the config file, the command, the plugins and devices), each atomically.
void write_run_record(const std::string& dir, const std::string& resolved_config, const std::string& run_json);

// The keys whose values differ between the configuration a run was started with (`saved`, its config.toml) and the
// one resuming it (`now`), as "key: old -> new" lines, leaving out the keys that may change on a resume (epochs,
// max_steps, checkpointing, progress, evaluation data, device and memory settings, logging: docs/user_guide.md).
// A key present on one side only shows "(absent)" on the other.
std::vector<std::string> resume_incompatible_keys(const std::string& saved, const std::string& now);

// A JSON string literal.
std::string json_string(const std::string& v);

}  // namespace kiln
