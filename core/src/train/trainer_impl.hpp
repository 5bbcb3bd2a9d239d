// The training run Trainer::run drives: its state and steps, shared by trainer.cpp (the epochs, steps and checkpoints)
// and trainer_setup.cpp (what the run sets up before its first step). Private to the core.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>

#include "evaluation.hpp"
#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"
#include "kiln/evaluation.hpp"
#include "kiln/files.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "kiln/trainer.hpp"
#include "last_batch.hpp"
#include "loss_scaler.hpp"
#include "progress.hpp"
#include "resume_checks.hpp"
#include "run_dir.hpp"
#include "run_guards.hpp"
#include "run_ranks.hpp"
#include "stop_signals.hpp"
#include "tensorboard.hpp"
#include "train_position.hpp"

namespace kiln::training {

using Clock = std::chrono::steady_clock;
inline double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Passes metrics.jsonl's text on to the file and each complete record (a line) to RunInfo::on_record, so a host that
// embeds the trainer (the Python module) gets the records as they are written, without reading the file back.
class RecordTee : public std::streambuf {
 public:
  RecordTee(std::streambuf* file, const std::function<void(const std::string&)>& f) : file_(file), f_(f) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    if (traits_type::eq_int_type(file_->sputc(traits_type::to_char_type(c)), traits_type::eof()))
      return traits_type::eof();
    if (traits_type::to_char_type(c) != '\n') {
      line_ += traits_type::to_char_type(c);
    } else {
      file_->pubsync();  // on disk before the host sees it
      f_(line_);
      line_.clear();
    }
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i)
      if (traits_type::eq_int_type(overflow(traits_type::to_int_type(s[i])), traits_type::eof())) return i;
    return n;
  }
  int sync() override { return file_->pubsync(); }

 private:
  std::streambuf* file_;
  const std::function<void(const std::string&)>& f_;
  std::string line_;
};

// What every rank decides after a step or an epoch: stop (a signal, or max_steps reached) and checkpoint (due by
// steps or minutes).
struct AfterStep {
  int stop_signal = 0;
  bool at_max = false;
  bool due = false;
};

// One epoch's progress line and running sums (what a mid-epoch checkpoint's Position holds, and the input wait).
struct EpochRun {
  EpochRun(std::ostream& out, const TrainSettings& ts, int64_t epoch_0, int64_t per_epoch, size_t heads)
      : epoch(epoch_0), prog(out, ts.progress, epoch_0 + 1, ts.epochs, per_epoch), head_sum(heads, 0.0) {}
  int64_t epoch;  // 0-based
  Progress prog;
  double loss_sum = 0, wait = 0, norm_sum = 0;
  int64_t batches = 0, examples = 0, norms = 0;
  std::vector<double> head_sum;
  Clock::time_point t0;
};

// One call of Trainer::run: what it sets up before the first step and carries through the epochs. The members are
// declared in the order the run sets them up, so they are destroyed in reverse (the runner before the run
// directory's lock and the data pipelines, the signal handlers first).
class TrainingRun {
 public:
  TrainingRun(Session& s, std::ostream& out, const RunInfo& info);
  TrainReport run();

 private:
  // Before the first step.
  void open_data();
  void claim_run_dir();
  void read_initial_weights();
  void start_runner();
  void resume_or_start_over();
  void resume_from_checkpoint();
  void write_run_json() const;
  void write_vocabulary() const;
  void open_logs();
  void start_early_stopping();
  // The epochs; each returns true when the run ends there.
  bool train_epoch(int64_t epoch);
  std::optional<Element> first_batch(EpochRun& e);
  std::optional<Element> pull(EpochRun& e);
  bool more_batches(int64_t k) const { return ts_.steps_per_epoch == 0 || k < ts_.steps_per_epoch; }
  void train_step(EpochRun& e, const Element& b);
  void report_data_read();
  [[noreturn]] void stop_on_nonfinite(EpochRun& e, const Element& b, float loss);
  [[noreturn]] void stop_on_divergence(EpochRun& e);
  void write_step_record(const EpochRun& e, const StepResult& r, const StepScalars& sc, double el);
  std::string progress_extra(const EpochRun& e) const;
  // Loss scaling computes the gradient norm too; it is shown where clip_norm asked for it.
  bool shows_grad_norm() const { return !scaler_.active() || s_.optimizer().clip_norm > 0; }
  bool stop_mid_epoch(EpochRun& e, const std::optional<Element>& next);
  EpochMetrics finish_epoch(EpochRun& e);
  void print_epoch_line(const EpochMetrics& em);
  void write_epoch_record(const EpochMetrics& em);
  bool early_stop_after(const EpochMetrics& em, int64_t epoch);
  std::optional<EpochMetrics> best_epoch_record() const;
  bool end_epoch(int64_t epoch, bool es_stop);
  // Stops, checkpoints.
  AfterStep after_step();
  bool checkpoint_due() const;
  void write_checkpoint(Checkpoint& c);
  void write_epoch_checkpoint(int64_t epochs_done);
  std::string resume_command() const { return "kiln train " + s_.config().file() + " --resume"; }

  Session& s_;
  std::ostream& out_;
  const RunInfo& info_;
  const TrainSettings& ts_;
  // Across processes (e.g. MPI ranks) every rank trains; rank 0 alone writes the run directory (the host prints only
  // rank 0's output).
  ProcessGroup* pg_;
  bool lead_;
  std::string dir_key_;
  const std::string ckpt_path_, metrics_path_, best_path_;
  std::unique_ptr<Stage> train_data_, test_data_;
  RowShare rows_;  // the rows of each batch this process's train pipeline fills (an MPI rank's share)
  int64_t per_epoch_ = -1;
  std::optional<RunLock> lock_;
  PriorRun prior_;
  RunnerContext rctx_;
  std::unique_ptr<Runner> runner_;
  int64_t start_epoch_ = 0, step_ = 0;
  bool resumed_ = false;
  std::optional<Position> resume_at_;  // a mid-epoch checkpoint's position inside epoch start_epoch_
  // metrics_ writes through it when the host asked for the records (RunInfo::on_record).
  std::unique_ptr<RecordTee> record_tee_;
  std::ofstream metrics_;  // rank 0's alone; the other ranks' writes go nowhere
  std::unique_ptr<TensorBoardWriter> tb_;
  TrainReport report_;
  Clock::time_point t_run_, last_checkpoint_;
  std::optional<StopSignals> signals_;
  EarlyStopper es_;
  std::optional<EpochMetrics> best_metrics_;  // the best epoch's, for the report when early stopping restores it
  DivergenceGuard diverge_;
  LossScaler scaler_;
  // [init] from, read and checked before the devices open.
  std::optional<InitialWeights> init_;
};

}  // namespace kiln::training
