// What a training run sets up before its first step: the data pipelines, the run directory, the initial weights,
// the runner, the resume position, the run's files and logs, and early stopping.
#include "trainer_impl.hpp"

namespace kiln::training {

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

}  // namespace kiln::training
