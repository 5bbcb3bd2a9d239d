// The training loop.
#include "kiln/trainer.hpp"

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

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os << std::setprecision(8) << v;
  return os.str();
}

// {"digit": 0.31, "parity": 0.05}: one value per head; skip_negative writes a negative value (no accuracy) as null.
std::string per_head_json(const std::vector<OutputSpec>& heads, const std::vector<double>& v, bool skip_negative) {
  std::string j = "{";
  for (size_t i = 0; i < v.size() && i < heads.size(); ++i) {
    if (j.size() > 1) j += ",";
    j += "\"" + heads[i].layer + "\":" + (skip_negative && v[i] < 0 ? std::string("null") : json_num(v[i]));
  }
  return j + "}";
}

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

TrainingRun::TrainingRun(Session& s, std::ostream& out, const RunInfo& info)
    : s_(s),
      out_(out),
      info_(info),
      ts_(s.train()),
      pg_(s.strategy().process_group()),
      lead_(!pg_ || pg_->rank() == 0),
      ckpt_path_(ts_.output_dir + "/checkpoint.kiln"),
      metrics_path_(ts_.output_dir + "/metrics.jsonl"),
      best_path_(ts_.output_dir + "/checkpoint-best.kiln"),
      es_(ts_.early_stopping),
      diverge_(ts_.divergence_factor),
      scaler_(s.model().precision) {}

TrainReport TrainingRun::run() {
  // Ranks started with different configs are refused before anything else.
  if (pg_ && pg_->size() > 1) check_same_config(*pg_, s_.config().resolved_text(), s_.config().file());
  dir_key_ = check_output_dir(s_);
  open_data();
  claim_run_dir();
  read_initial_weights();
  start_runner();
  resume_or_start_over();
  if (lead_) write_run_json();
  // A text source's vocabulary goes with the run, so `kiln sample` decodes what the model writes.
  if (lead_ && !s_.vocabulary().empty()) write_vocabulary();
  open_logs();

  t_run_ = Clock::now();
  signals_.emplace();
  last_checkpoint_ = Clock::now();
  start_early_stopping();
  if (ts_.max_steps > 0 && step_ >= ts_.max_steps) {
    out_ << "nothing to train: the run is at step " << step_ << " and [train] max_steps is " << ts_.max_steps
         << " (raise it, or set it to 0, to continue)\n";
    report_.steps = step_;
    return std::move(report_);
  }
  for (int64_t epoch = start_epoch_; epoch < ts_.epochs; ++epoch)
    if (train_epoch(epoch)) break;
  report_data_read();
  report_.seconds = secs(t_run_, Clock::now());
  report_.steps = step_;
  return std::move(report_);
}

// What the train pipeline's sources read from files, one line (per rank across processes: each reads its share).
void TrainingRun::report_data_read() {
  std::vector<StageStats> stats;
  train_data_->collect_stats(stats);
  uint64_t mine = 0;
  for (const auto& st : stats) mine += st.bytes_read;
  const std::vector<uint64_t> all = pg_ && pg_->size() > 1 ? gather_counts(*pg_, mine) : std::vector<uint64_t>{mine};
  uint64_t total = 0;
  for (uint64_t b : all) total += b;
  if (!lead_ || total == 0) return;
  out_ << "data.train read " << total << " bytes from files";
  if (all.size() > 1) {
    out_ << " (";
    for (size_t r = 0; r < all.size(); ++r) out_ << (r ? ", " : "") << "rank " << r << ": " << all[r];
    out_ << ")";
  }
  out_ << "\n";
}

void TrainingRun::open_data() {
  train_data_ = s_.make_pipeline("train");
  if (!train_data_) throw ConfigError(s_.config().file() + ": missing [data.train] (stages = [...]) to train on");
  test_data_ = ts_.evaluate ? s_.make_pipeline("test") : nullptr;
  // Ranks that would read different files (the same config resolved on other hosts or in other directories) are
  // refused before a step mixes their examples into one batch.
  if (pg_ && pg_->size() > 1) {
    std::string what = describe_data(s_.config(), "train", *train_data_);
    if (test_data_) what += describe_data(s_.config(), "test", *test_data_);
    check_same_data(*pg_, what, s_.config().file());
  }
  // Labels as the data shapes them tell the model what its heads are trained against.
  s_.model().label_shape = train_data_->label_shape();
  // Every batch, train and test, is checked against what the losses accept before it reaches a device.
  const LabelRules rules = label_rules(s_.model());
  rows_ = train_rows(s_.config(), s_.strategy(), ts_.batch_size);
  train_data_ = checked_stage(std::move(train_data_), rules, describe_source(s_.config(), "train"), rows_.begin,
                              rows_.end, ts_.batch_size);
  if (test_data_) test_data_ = checked_stage(std::move(test_data_), rules, describe_source(s_.config(), "test"));
  const int64_t hint = train_data_->size_hint();
  check_last_batch(s_, hint);  // an epoch's last partial batch the model cannot train on, refused before step 1
  per_epoch_ = hint > 0 ? (hint + ts_.batch_size - 1) / ts_.batch_size : -1;
  if (ts_.steps_per_epoch > 0)
    per_epoch_ = per_epoch_ > 0 ? std::min(per_epoch_, ts_.steps_per_epoch) : ts_.steps_per_epoch;
  auto& sched = s_.optimizer().schedule;
  // A warmup as long as the run never reaches the learning rate the config asks for. The run is its epochs:
  // [train] max_steps only says where this process stops (a resume with max_steps = 0 continues the same schedule).
  // Said before step 1 rather than refused: a short trial of a long run's config (steps_per_epoch = 1) is common.
  const int64_t total = per_epoch_ > 0 ? per_epoch_ * ts_.epochs : 0;
  if (sched.warmup_steps > 0 && total > 0 && sched.warmup_steps >= total) {
    const auto opt = s_.config().root().table("optimizer");
    const auto sc = opt ? opt->table("schedule") : std::nullopt;
    out_ << "warning: " << (sc ? sc->where("warmup_steps") : s_.config().file() + ": [optimizer.schedule] warmup_steps")
         << ": " << sched.warmup_steps << " warmup steps, but the whole run is " << total << " steps (" << ts_.epochs
         << " epoch(s) of " << per_epoch_ << "): the learning rate ends at "
         << s_.optimizer().learning_rate_at(total - 1)
         << ", never reaching learning_rate = " << s_.optimizer().learning_rate_at(sched.warmup_steps)
         << ". Use fewer warmup steps, or train longer\n";
  }
  if (sched.kind == ScheduleKind::cosine && sched.total_steps == 0 && per_epoch_ > 0)
    sched.total_steps = std::max<int64_t>(per_epoch_ * ts_.epochs - sched.warmup_steps, 1);  // the rest of the run
}

// The run directory belongs to this process until it ends (a second `kiln train` of the same run is refused, naming
// this one), and an earlier run in it is refused before any device memory is taken.
void TrainingRun::claim_run_dir() {
  if (lead_) {
    create_output_dir(ts_.output_dir, dir_key_);
    lock_.emplace(ts_.output_dir, dir_key_, info_.command.empty() ? "kiln train " + s_.config().file() : info_.command);
  }
  prior_ = inspect_run_dir(ts_.output_dir);
  if (lead_ && !ts_.resume && !ts_.overwrite && prior_.exists())
    throw ConfigError(
        ts_.output_dir + " already holds a run (" +
        (prior_.checkpoint ? std::string("checkpoint.kiln, ") : std::string()) + "metrics.jsonl with " +
        std::to_string(prior_.metric_lines) +
        " records); it is not overwritten silently: pass --resume (or [train] "
        "resume = true) to continue it, --overwrite (or [train] overwrite = true) to start it over, or give "
        "this run another [run] name or output directory (" +
        dir_key_ + ")");
}

void TrainingRun::start_runner() {
  s_.open_devices();
  // Say what the run uses before it uses it: backend, device and memory limit of every device.
  for (const DeviceContext& d : s_.devices()) {
    const DeviceInfo& info = d.device->info();
    out_ << "device " << info.label() << ": " << info.name << ", memory limit "
         << (d.allocator ? format_bytes(d.allocator->limit()) : std::string("none"))
         << (d.allocator && d.allocator->options().growth ? " (growth on demand)" : " (reserved at start)")
         << (s_.explicit_limit() ? " from [device] memory_limit" : "") << "\n";
    for (DType t : s_.model().compute_types())
      if (Support sp = d.device->supports_dtype(t); sp.yes && !sp.reason.empty())
        out_ << "note: " << info.label() << ": " << sp.reason << "\n";
  }
  // And how the data is read: each source decoded once into memory, or streamed every epoch.
  if (lead_)
    for (const char* which : {"train", "test"})
      if (std::string r = s_.source_reading(which); !r.empty() && (std::string(which) == "train" || test_data_))
        out_ << "data." << which << " source: " << r << "\n";
  rctx_ = s_.runner_context();
  // Refuse up front, with the full plan report, when the plan cannot fit (memory_policy "fit" turns on savers first).
  if (ts_.memory_policy != "none") {
    enforce_memory_plan(s_, out_);
    rctx_ = s_.runner_context();
  }
  runner_ = s_.strategy().create(rctx_);
  if (!runner_->report().empty()) out_ << runner_->report();
}

// [init] from: read whole and checked against the model before any device memory is taken. A run that resumes
// continues from its own checkpoint instead, whose weights are the ones it trained.
void TrainingRun::read_initial_weights() {
  if (s_.init() && !(ts_.resume && prior_.checkpoint))
    init_ = load_initial_weights(*s_.init(), s_.model(), s_.optimizer());
}

void TrainingRun::resume_or_start_over() {
  if (ts_.resume && prior_.checkpoint) {
    check_resume_config(s_, ts_.output_dir);
    resume_from_checkpoint();
    if (s_.init())
      out_ << "[init] from = \"" << s_.init()->from_as_set
           << "\" is not applied: the run resumed from its own checkpoint, whose weights win\n";
  } else if (ts_.resume) {
    out_ << "nothing to resume: " << ts_.output_dir << " holds no checkpoint.kiln"
         << (prior_.metric_lines > 0 ? " (its metrics.jsonl is started over)" : "") << "; starting a new run\n";
  } else if (lead_ && prior_.exists()) {
    remove_checkpoints(ckpt_path_);  // --overwrite: nothing of the old run may be resumed into the new one
    out_ << "overwriting the earlier run in " << ts_.output_dir << "\n";
  }
  if (init_) {
    runner_->load_state(init_->tensors);
    out_ << init_->summary << "\n";
    init_.reset();
  }
  // A run started over leaves no TensorBoard events of the earlier one: TensorBoard would show both as one run.
  if (lead_ && !resumed_) remove_tensorboard_events(ts_.output_dir);
}

void TrainingRun::resume_from_checkpoint() {
  // The newest checkpoint that loads: a damaged one falls back to the one before ([train] keep_checkpoints).
  LoadedCheckpoint lc = load_newest_checkpoint(ckpt_path_);
  Checkpoint& c = lc.checkpoint;
  scaler_.load(c.tensors, lc.path);
  check_checkpoint_fits(s_, *runner_, c, lc.path, per_epoch_, train_data_->size_hint());
  if (!lc.warning.empty()) out_ << lc.warning << "\n";
  runner_->load_state(c.tensors);
  start_epoch_ = c.epoch;
  step_ = c.step;
  resumed_ = true;
  if (!c.data_state.empty()) resume_at_ = decode_position(c.data_state, lc.path);
  out_ << "resumed from " << lc.path << " at epoch " << start_epoch_ + (resume_at_ ? 1 : 0) << ", step " << step_;
  if (resume_at_)
    out_ << " (mid-epoch: " << resume_at_->batches << " batches of epoch " << start_epoch_ + 1 << " done)";
  out_ << "\n";
  // Records written after that checkpoint (the run was stopped before its next one) are written again below.
  if (int64_t dropped = lead_ ? trim_metrics(metrics_path_, step_) : 0; dropped > 0)
    out_ << "metrics.jsonl: dropped " << dropped << " record(s) written after the checkpoint's step " << step_
         << "; this run writes them again\n";
}

void TrainingRun::write_run_json() const {
  std::ostringstream rj;
  rj << "{\"kiln_version\":" << json_string(KILN_VERSION_STRING) << ",\"plugin_api\":" << kApiVersion
     << ",\"config_file\":" << json_string(s_.config().file()) << ",\"command\":" << json_string(info_.command)
     << ",\"run\":" << json_string(s_.run_name()) << ",\"seed\":" << s_.seed()
     << ",\"resumed_at_step\":" << (resumed_ ? std::to_string(step_) : std::string("null")) << ",\"plugins\":[";
  for (size_t i = 0; i < info_.plugins.size(); ++i) rj << (i ? "," : "") << json_string(info_.plugins[i]);
  rj << "],\"devices\":[";
  for (size_t i = 0; i < s_.devices().size(); ++i) {
    const DeviceInfo& d = s_.devices()[i].device->info();
    rj << (i ? "," : "") << "{\"device\":" << json_string(d.label()) << ",\"name\":" << json_string(d.name)
       << ",\"memory_limit\":"
       << (s_.devices()[i].allocator ? std::to_string(s_.devices()[i].allocator->limit()) : "null") << "}";
  }
  rj << "],\"strategy\":" << json_string(s_.strategy().name()) << "}";
  write_run_record(ts_.output_dir, s_.config().resolved_text(), rj.str());
}

void TrainingRun::write_vocabulary() const {
  const std::string vpath = ts_.output_dir + "/vocab.json";
  try {
    write_file_atomically(vpath, s_.vocabulary() + "\n");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the vocabulary; the output directory comes from " + dir_key_ + ")");
  }
}

void TrainingRun::open_logs() {
  if (lead_) {
    // Created (or emptied) without following a link at its name, then appended to.
    const int fd = open_no_follow(metrics_path_, O_WRONLY | O_CREAT | (resumed_ ? 0 : O_TRUNC));
    if (fd < 0)
      throw Error(metrics_path_ + ": cannot open the metrics file for writing: " + std::strerror(errno) +
                  " (the output directory comes from " + dir_key_ + ")");
    ::close(fd);
    metrics_.open(metrics_path_, std::ios::app);
    if (metrics_ && info_.on_record) {
      record_tee_ = std::make_unique<RecordTee>(metrics_.rdbuf(), info_.on_record);
      static_cast<std::ostream&>(metrics_).rdbuf(record_tee_.get());
    }
  }
  if (lead_ && !metrics_)
    throw Error(metrics_path_ + ": cannot open the metrics file for writing (the output directory comes from " +
                dir_key_ + ")");
  // [log] tensorboard: the same scalars as metrics.jsonl, in a new event file per process (TensorBoard reads them all).
  if (ts_.tensorboard && lead_) tb_ = std::make_unique<TensorBoardWriter>(ts_.output_dir);
}

// A resumed run rebuilds the best value and the epochs since from metrics.jsonl's epoch records, so it stops where an
// uninterrupted one would.
void TrainingRun::start_early_stopping() {
  const EarlyStopping& es = ts_.early_stopping;
  if (!es.on) return;
  if (es.metric != "train_loss" && !test_data_)
    throw ConfigError(
        s_.config().file() + ": [train] early_stopping watches " + es.metric +
        ", which needs an evaluation: add [data.test] and keep [train] evaluate = true, or watch train_loss");
  if (!resumed_) return;
  std::ifstream old(metrics_path_);
  const std::regex re("\"epoch\":([0-9]+).*\"" + es.metric + "\":([-0-9.eE+]+)");
  for (std::string l; std::getline(old, l);) {
    std::smatch m;
    if (l.find("\"event\":\"epoch\"") != std::string::npos && std::regex_search(l, m, re))
      es_.observe(std::stod(m[2]), std::stoll(m[1]));
  }
}

bool TrainingRun::train_epoch(int64_t epoch) {
  train_data_->reset(static_cast<uint64_t>(epoch));
  EpochRun e(out_, ts_, epoch, per_epoch_, s_.model().outputs.size());
  // One batch of lookahead: batch k+1 is handed to runner->prefetch() before step k runs, so its copy into the
  // device's second input buffer overlaps step k ([train] device_prefetch).
  std::optional<Element> b = first_batch(e);
  while (b) {
    std::optional<Element> nb;
    if (more_batches(e.batches + 1)) {
      nb = pull(e);
      if (nb && ts_.device_prefetch) runner_->prefetch(*nb);
    }
    train_step(e, *b);
    b = std::move(nb);
    if (stop_mid_epoch(e, b)) return true;
  }
  const EpochMetrics em = finish_epoch(e);
  print_epoch_line(em);
  write_epoch_record(em);
  report_.epochs.push_back(em);
  const bool es_stop = early_stop_after(em, epoch);
  return end_epoch(epoch, es_stop);
}

// The epoch's first batch and its start time. A resumed position restores the epoch's sums and starts with the batch
// its pipeline had already delivered (copied in its step, like an epoch's first batch).
std::optional<Element> TrainingRun::first_batch(EpochRun& e) {
  std::optional<Element> pending;
  if (resume_at_) {
    train_data_->restore(resume_at_->pipeline);
    e.batches = resume_at_->batches;
    e.examples = resume_at_->examples;
    e.loss_sum = resume_at_->loss_sum;
    e.norm_sum = resume_at_->norm_sum;
    e.norms = resume_at_->norms;
    if (resume_at_->head_sum.size() == e.head_sum.size()) e.head_sum = resume_at_->head_sum;
    pending = std::move(resume_at_->pending);
    resume_at_.reset();
  }
  e.t0 = Clock::now();
  return pending ? std::move(pending) : more_batches(e.batches) ? pull(e) : std::nullopt;
}

std::optional<Element> TrainingRun::pull(EpochRun& e) {
  auto tw = Clock::now();
  auto el = train_data_->next();
  e.wait += secs(tw, Clock::now());
  return el;
}

void TrainingRun::train_step(EpochRun& e, const Element& b) {
  StepScalars sc{step_, static_cast<float>(s_.optimizer().learning_rate_at(step_)), scaler_.scale()};
  if (!report_.first_step_start) report_.first_step_start = Clock::now();
  StepResult r = runner_->train_step(b, sc);
  scaler_.update(r.skipped);
  if (!std::isfinite(r.total_loss)) stop_on_nonfinite(e, b, r.total_loss);
  if (diverge_.observe(r.total_loss)) {
    ++step_;  // this step's weights are applied: the message counts it
    stop_on_divergence(e);
  }
  e.loss_sum += r.total_loss * static_cast<double>(b.batch);
  for (size_t i = 0; i < r.losses.size() && i < e.head_sum.size(); ++i)
    e.head_sum[i] += static_cast<double>(r.losses[i]) * static_cast<double>(b.batch);
  if (r.grad_norm >= 0 && std::isfinite(r.grad_norm)) e.norm_sum += r.grad_norm, ++e.norms;
  e.examples += b.batch;
  ++e.batches;
  ++step_;
  double el = secs(e.t0, Clock::now());
  if (ts_.log_every_steps > 0 && step_ % ts_.log_every_steps == 0) write_step_record(e, r, sc, el);
  e.prog.update(e.batches, e.loss_sum / static_cast<double>(e.examples), static_cast<double>(e.examples) / el,
                el / static_cast<double>(e.batches), false, progress_extra(e));
}

void TrainingRun::stop_on_nonfinite(EpochRun& e, const Element& b, float loss) {
  e.prog.finish();
  metrics_.flush();
  std::string layer = runner_->find_nonfinite_layer(b, step_);
  std::ostringstream os;
  os << "training stopped: the loss is " << loss << " at step " << step_ << " (epoch " << e.epoch + 1 << ", batch "
     << e.batches + 1 << "); "
     << (layer.empty() ? "every layer output is finite, so the loss itself overflowed (check labels and learning rate)"
                       : "the first layer whose output is non-finite is '" + layer + "'")
     << ". The weights were not updated by this step; the last checkpoint and metrics are intact.";
  throw NumericError(os.str());
}

void TrainingRun::stop_on_divergence(EpochRun& e) {
  e.prog.finish();
  metrics_.flush();
  std::ostringstream os;
  os << "training stopped: the loss diverged at step " << step_ << " (epoch " << e.epoch + 1 << "): the mean loss of "
     << "the last " << DivergenceGuard::kWindow << " steps is " << diverge_.recent() << ", more than "
     << diverge_.factor() << " times the mean of the first " << DivergenceGuard::kWindow << " steps ("
     << diverge_.baseline()
     << ") ([train] divergence_factor). Lower [optimizer] learning_rate (or add warmup or clip_norm); set [train] "
        "divergence_factor = 0 to train on regardless. The last checkpoint and metrics are intact.";
  throw NumericError(os.str());
}

// One record per logged step: the loss of this step (each head's, weighted, beside the total), the learning rate it
// used, the epoch's throughput so far and the device memory in use (the first device's allocator).
void TrainingRun::write_step_record(const EpochRun& e, const StepResult& r, const StepScalars& sc, double el) {
  metrics_ << "{\"event\":\"step\",\"epoch\":" << e.epoch + 1 << ",\"step\":" << step_
           << ",\"loss\":" << json_num(r.total_loss);
  const auto& outs = s_.model().outputs;
  if (outs.size() > 1 && r.losses.size() == outs.size()) {
    metrics_ << ",\"losses\":{";
    for (size_t h = 0; h < outs.size(); ++h)
      metrics_ << (h ? "," : "") << json_string(outs[h].layer) << ":" << json_num(r.losses[h]);
    metrics_ << "}";
  }
  if (r.grad_norm >= 0 && shows_grad_norm()) metrics_ << ",\"grad_norm\":" << json_num(r.grad_norm);
  if (scaler_.active())
    metrics_ << ",\"loss_scale\":" << json_num(sc.loss_scale) << ",\"skipped\":" << (r.skipped ? "true" : "false")
             << ",\"skipped_steps\":" << scaler_.skipped();
  metrics_ << ",\"learning_rate\":" << json_num(sc.lr)
           << ",\"examples_per_s\":" << json_num(el > 0 ? static_cast<double>(e.examples) / el : 0);
  if (!s_.devices().empty() && s_.devices().front().allocator)
    metrics_ << ",\"device_memory_in_use\":" << s_.devices().front().allocator->stats().in_use;
  metrics_ << "}\n";
  if (tb_) {
    std::vector<std::pair<std::string, double>> v{{"loss", r.total_loss}, {"learning_rate", sc.lr}};
    if (r.grad_norm >= 0) v.emplace_back("grad_norm", r.grad_norm);
    tb_->scalars(step_, v);
  }
}

// Per-head losses (several outputs) and the gradient norm ([optimizer] clip_norm), for the progress line.
std::string TrainingRun::progress_extra(const EpochRun& e) const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(4);
  if (e.head_sum.size() > 1 && e.examples > 0)
    for (size_t i = 0; i < e.head_sum.size(); ++i)
      os << "  " << s_.model().outputs[i].layer << " " << e.head_sum[i] / static_cast<double>(e.examples);
  if (e.norms > 0 && shows_grad_norm()) os << "  grad_norm " << e.norm_sum / static_cast<double>(e.norms);
  if (scaler_.active())
    os << std::setprecision(0) << "  loss_scale " << scaler_.scale() << "  skipped " << scaler_.skipped();
  return os.str();
}

// A mid-epoch checkpoint after this step: asked for by a signal, by max_steps, or due by steps or minutes. It holds
// the position inside the epoch (the pipeline's state and the batch already pulled, `next`), so a resumed run
// continues with exactly the batches this one would have trained on.
bool TrainingRun::stop_mid_epoch(EpochRun& e, const std::optional<Element>& next) {
  const AfterStep a = after_step();
  if ((a.stop_signal != 0 || a.at_max || a.due) && next) {
    Position here;
    here.batches = e.batches;
    here.examples = e.examples;
    here.loss_sum = e.loss_sum;
    here.norm_sum = e.norm_sum;
    here.norms = e.norms;
    here.head_sum = e.head_sum;
    here.pipeline = train_data_->save();
    // Each rank filled only its rows of the pulled batch: the checkpoint holds all of them, so any number of
    // processes resumes from it.
    here.pending = pg_ && !rows_.all() ? gather_rows(*pg_, *next, rows_, ts_.batch_size) : next;
    Checkpoint c;
    c.epoch = e.epoch;
    c.step = step_;
    c.data_state = encode_position(here);
    metrics_.flush();
    write_checkpoint(c);
  }
  if ((a.stop_signal == 0 && !a.at_max) || !next) return false;
  e.prog.finish();
  metrics_.flush();
  if (a.stop_signal != 0) {
    std::ostringstream os;
    os << "stopped by " << (a.stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << " after step " << step_ << " (epoch "
       << e.epoch + 1 << ", batch " << e.batches << "); checkpoint written to " << ckpt_path_
       << "; resume with: " << resume_command();
    throw Interrupted(os.str(), a.stop_signal);
  }
  out_ << "stopped at max_steps = " << ts_.max_steps << " (epoch " << e.epoch + 1 << ", batch " << e.batches
       << "); checkpoint written to " << ckpt_path_ << "; continue with: " << resume_command()
       << " --set train.max_steps=0\n";
  return true;
}

// The epoch's figures, its last progress line and the evaluation on the test data.
EpochMetrics TrainingRun::finish_epoch(EpochRun& e) {
  EpochMetrics em;
  em.epoch = e.epoch + 1;
  em.seconds = secs(e.t0, Clock::now());
  em.train_loss = e.examples ? e.loss_sum / static_cast<double>(e.examples) : 0;
  em.examples_per_s = em.seconds > 0 ? static_cast<double>(e.examples) / em.seconds : 0;
  em.s_per_batch = e.batches ? em.seconds / static_cast<double>(e.batches) : 0;
  em.input_wait_fraction = em.seconds > 0 ? e.wait / em.seconds : 0;
  em.grad_norm = e.norms > 0 && shows_grad_norm() ? e.norm_sum / static_cast<double>(e.norms) : -1;
  for (double h : e.head_sum) em.train_losses.push_back(e.examples ? h / static_cast<double>(e.examples) : 0);
  e.prog.update(e.batches, em.train_loss, em.examples_per_s, em.s_per_batch, true, progress_extra(e));
  e.prog.finish();
  if (test_data_) {
    Evaluation ev = evaluate(*runner_, *test_data_, s_.model(), s_.optimizer().ema_decay > 0);
    em.test_loss = ev.loss;
    em.test_accuracy = ev.accuracy;
    em.test_losses = ev.losses;
    em.test_accuracies = ev.accuracies;
  }
  return em;
}

void TrainingRun::print_epoch_line(const EpochMetrics& em) {
  const auto& heads = s_.model().outputs;
  std::ostringstream line;
  line << "epoch " << em.epoch << "/" << ts_.epochs << ": train loss " << std::fixed << std::setprecision(4)
       << em.train_loss;
  if (em.test_loss >= 0) line << ", test loss " << em.test_loss;
  if (em.test_accuracy >= 0) line << ", test accuracy " << em.test_accuracy;
  if (heads.size() > 1) {
    line << " (";
    for (size_t i = 0; i < heads.size(); ++i) {
      line << (i ? "; " : "") << heads[i].layer << ": train loss " << em.train_losses[i];
      if (i < em.test_losses.size()) line << ", test loss " << em.test_losses[i];
      if (i < em.test_accuracies.size() && em.test_accuracies[i] >= 0)
        line << ", test accuracy " << em.test_accuracies[i];
    }
    line << ")";
  }
  if (em.grad_norm >= 0) line << ", grad_norm " << em.grad_norm;
  line << std::setprecision(1) << ", " << em.seconds << " s, " << std::setprecision(0) << em.examples_per_s
       << " examples/s, " << std::setprecision(4) << em.s_per_batch << " s/batch, input-bound: " << std::setprecision(0)
       << em.input_wait_fraction * 100 << "% of step time";
  out_ << line.str() << "\n";
  // Per-replica / per-device throughput of multi-device strategies.
  if (std::string rep = runner_->report(); !rep.empty()) out_ << rep;
  out_ << std::flush;
}

void TrainingRun::write_epoch_record(const EpochMetrics& em) {
  const auto& heads = s_.model().outputs;
  metrics_ << "{\"event\":\"epoch\",\"epoch\":" << em.epoch << ",\"step\":" << step_
           << ",\"train_loss\":" << json_num(em.train_loss)
           << ",\"test_loss\":" << (em.test_loss >= 0 ? json_num(em.test_loss) : "null")
           << ",\"test_accuracy\":" << (em.test_accuracy >= 0 ? json_num(em.test_accuracy) : "null")
           << ",\"seconds\":" << json_num(em.seconds) << ",\"examples_per_s\":" << json_num(em.examples_per_s)
           << ",\"s_per_batch\":" << json_num(em.s_per_batch)
           << ",\"input_wait_fraction\":" << json_num(em.input_wait_fraction);
  if (em.grad_norm >= 0) metrics_ << ",\"grad_norm\":" << json_num(em.grad_norm);
  if (heads.size() > 1) {
    metrics_ << ",\"train_losses\":" << per_head_json(heads, em.train_losses, false);
    if (!em.test_losses.empty())
      metrics_ << ",\"test_losses\":" << per_head_json(heads, em.test_losses, false)
               << ",\"test_accuracies\":" << per_head_json(heads, em.test_accuracies, true);
  }
  metrics_ << "}\n" << std::flush;
  if (tb_) {
    std::vector<std::pair<std::string, double>> v{{"train_loss", em.train_loss}};
    if (em.test_loss >= 0) v.emplace_back("test_loss", em.test_loss);
    if (em.test_accuracy >= 0) v.emplace_back("test_accuracy", em.test_accuracy);
    if (em.grad_norm >= 0) v.emplace_back("epoch_grad_norm", em.grad_norm);
    tb_->scalars(step_, v);
    tb_->flush();
  }
}

// [train] early_stopping after an epoch: keeps a new best epoch's weights ([train] early_stopping restore_best) and,
// when the run stops, says so and restores them. Returns true when the run stops.
bool TrainingRun::early_stop_after(const EpochMetrics& em, int64_t epoch) {
  const EarlyStopping& es = ts_.early_stopping;
  if (!es.on) return false;
  const double v = es.metric == "train_loss"  ? em.train_loss
                   : es.metric == "test_loss" ? em.test_loss
                                              : em.test_accuracy;
  const int64_t before = es_.best_epoch();
  const bool stop = es_.observe(v, epoch + 1) && epoch + 1 < ts_.epochs;
  if (es_.best_epoch() != before) best_metrics_ = em;
  if (es.restore_best && es_.best_epoch() != before) {  // a new best: keep its weights
    Checkpoint c;
    c.epoch = epoch + 1;
    c.step = step_;
    c.tensors = runner_->save_state();
    if (lead_) save_checkpoint(best_path_, c);
  }
  if (stop) {
    out_ << "early stopping after epoch " << epoch + 1 << ": " << es.metric << " has not improved by more than "
         << es.min_delta << " for " << es.patience << " epoch(s); the best was " << es_.best() << " at epoch "
         << es_.best_epoch();
    if (es.restore_best && es_.best_epoch() != epoch + 1) {
      runner_->load_state(load_checkpoint(best_path_).tensors);
      out_ << " (its weights are restored, from " << best_path_ << ")";
      // The run ends with the best epoch's weights: its figures are the final ones, not the discarded epoch's.
      report_.final_metrics = best_metrics_ ? best_metrics_ : best_epoch_record();
      if (report_.final_metrics && report_.final_metrics->test_accuracy >= 0)
        out_ << "; final test accuracy " << std::fixed << std::setprecision(4) << report_.final_metrics->test_accuracy
             << " (epoch " << es_.best_epoch() << ")";
      if (report_.final_metrics) {
        const EpochMetrics& b = *report_.final_metrics;
        metrics_ << "{\"event\":\"restore_best\",\"epoch\":" << epoch + 1 << ",\"step\":" << step_
                 << ",\"restored_epoch\":" << b.epoch << ",\"train_loss\":" << json_num(b.train_loss)
                 << ",\"test_loss\":" << (b.test_loss >= 0 ? json_num(b.test_loss) : "null")
                 << ",\"test_accuracy\":" << (b.test_accuracy >= 0 ? json_num(b.test_accuracy) : "null") << "}\n"
                 << std::flush;
      }
    }
    out_ << "\n";
  }
  return stop;
}

// The best epoch's record in metrics.jsonl (a resumed run's best may be an epoch an earlier process trained).
std::optional<EpochMetrics> TrainingRun::best_epoch_record() const {
  std::ifstream f(metrics_path_);
  const std::string tag = "\"event\":\"epoch\",\"epoch\":" + std::to_string(es_.best_epoch()) + ",";
  auto value = [](const std::string& l, const std::string& key) {
    const auto at = l.find("\"" + key + "\":");
    if (at == std::string::npos) return -1.0;
    const char* p = l.c_str() + at + key.size() + 3;
    return std::strncmp(p, "null", 4) == 0 ? -1.0 : std::strtod(p, nullptr);
  };
  std::optional<EpochMetrics> found;
  for (std::string l; std::getline(f, l);) {
    if (l.find(tag) == std::string::npos) continue;
    EpochMetrics m;
    m.epoch = es_.best_epoch();
    m.train_loss = value(l, "train_loss");
    m.test_loss = value(l, "test_loss");
    m.test_accuracy = value(l, "test_accuracy");
    found = m;
  }
  return found;
}

// The epoch's checkpoint ([train] checkpoint_every, a stop before the last epoch, or due by steps or minutes) and the
// stop. Returns true when the run ends here.
bool TrainingRun::end_epoch(int64_t epoch, bool es_stop) {
  const AfterStep a = after_step();
  if (es_stop) {  // the final checkpoint holds the weights the run ends with
    write_epoch_checkpoint(epoch + 1);
    return true;
  }
  const bool stopping = (a.stop_signal != 0 || a.at_max) && epoch + 1 < ts_.epochs;
  if ((ts_.checkpoint_every > 0 && ((epoch + 1) % ts_.checkpoint_every == 0 || epoch + 1 == ts_.epochs)) || stopping ||
      a.due)
    write_epoch_checkpoint(epoch + 1);
  if (!stopping) return false;
  if (a.stop_signal != 0)
    throw Interrupted("stopped by " + std::string(a.stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + " after epoch " +
                          std::to_string(epoch + 1) + " (step " + std::to_string(step_) + "); checkpoint written to " +
                          ckpt_path_ + "; resume with: " + resume_command(),
                      a.stop_signal);
  out_ << "stopped at max_steps = " << ts_.max_steps << " after epoch " << epoch + 1 << "; checkpoint written to "
       << ckpt_path_ << "; continue with: " << resume_command() << " --set train.max_steps=0\n";
  return true;
}

// After a step or an epoch: a stop signal, max_steps reached, a checkpoint due. Across ranks, every rank stops and
// checkpoints after the same step.
AfterStep TrainingRun::after_step() {
  AfterStep a;
  a.stop_signal = stop_signal_received();
  a.at_max = ts_.max_steps > 0 && step_ >= ts_.max_steps;
  a.due = checkpoint_due();
  if (pg_ && pg_->size() > 1) {
    const StepAgreement ag = agree_after_step(*pg_, a.stop_signal, a.due);
    a.stop_signal = ag.stop_signal;
    a.due = ag.checkpoint_due;
  }
  return a;
}

// [train] checkpoint_every_steps / checkpoint_every_minutes: due after the step just done.
bool TrainingRun::checkpoint_due() const {
  return (ts_.checkpoint_every_steps > 0 && step_ % ts_.checkpoint_every_steps == 0) ||
         (ts_.checkpoint_every_minutes > 0 &&
          secs(last_checkpoint_, Clock::now()) >= 60 * ts_.checkpoint_every_minutes);
}

void TrainingRun::write_checkpoint(Checkpoint& c) {
  c.tensors = runner_->save_state();  // every rank: it may gather the optimizer state's shards
  scaler_.save(c.tensors);
  std::string failed;
  if (lead_) {
    try {
      save_checkpoint(ckpt_path_, c, ts_.keep_checkpoints);
    } catch (const Error& e) {
      failed = std::string(e.what()) + " (the output directory comes from " + dir_key_ + ")";
    }
  }
  if (pg_ && pg_->size() > 1) agree_checkpoint_written(*pg_, failed);
  if (!failed.empty()) throw Error(failed);
  last_checkpoint_ = Clock::now();
}

void TrainingRun::write_epoch_checkpoint(int64_t epochs_done) {
  Checkpoint c;
  c.epoch = epochs_done;
  c.step = step_;
  write_checkpoint(c);
}

}  // namespace

Trainer::Trainer(Session& s, std::ostream& out, RunInfo info) : s_(s), out_(out), info_(std::move(info)) {}

TrainReport Trainer::run() { return TrainingRun(s_, out_, info_).run(); }

}  // namespace kiln
