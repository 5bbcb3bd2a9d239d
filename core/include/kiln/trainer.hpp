// The training loop: epochs, evaluation, progress, metrics (JSON lines), atomic checkpoints, NaN detection.
#pragma once
#include <chrono>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "kiln/session.hpp"

namespace kiln {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  double test_loss = -1;      // -1: not evaluated
  double test_accuracy = -1;  // -1: no classification head or not evaluated
  double seconds = 0;
  double examples_per_s = 0;
  double s_per_batch = 0;
  double input_wait_fraction = 0;    // share of the epoch's time spent waiting for the input pipeline
  double grad_norm = -1;             // [optimizer] clip_norm: mean global gradient norm (before clipping) of the epoch
  std::vector<double> train_losses;  // per output (several heads), weighted as in the total
  std::vector<double> test_losses;   // per output
  std::vector<double> test_accuracies;  // per output; -1 for an mse head
};

struct TrainReport {
  std::vector<EpochMetrics> epochs;
  // The figures of the weights the run ends with, when they are not the last epoch's: early stopping restored the
  // best epoch's weights ([train] early_stopping restore_best).
  std::optional<EpochMetrics> final_metrics;
  double seconds = 0;
  int64_t steps = 0;
  // When this process began its first training step (steady clock); unset when it ran none. `kiln train` reports
  // the time from its start to this point, the wait a user sees before training begins.
  std::optional<std::chrono::steady_clock::time_point> first_step_start;
};

// Thrown by Trainer::run when SIGINT or SIGTERM stopped the run after a step and a checkpoint: the message says where
// and how to resume; exit_code() is 128 + the signal (130, 143).
class Interrupted : public Error {
 public:
  Interrupted(std::string msg, int signal) : Error(std::move(msg)), signal_(signal) {}
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
};

// What the host adds to the run's record (run.json in the output directory): its command line and the plugins it
// loaded ("name version path").
struct RunInfo {
  std::string command;
  std::vector<std::string> plugins;
  // Called on the training thread with each record appended to metrics.jsonl (one JSON object, without the newline),
  // once it is written; the lead rank only. It must not throw: a host that wants to stop the run raises SIGINT.
  std::function<void(const std::string&)> on_record;
};

class Trainer {
 public:
  Trainer(Session& s, std::ostream& out, RunInfo info = {});
  TrainReport run();

 private:
  Session& s_;
  std::ostream& out_;
  RunInfo info_;
};

}  // namespace kiln
