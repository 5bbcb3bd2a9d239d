// The training loop: epochs, steps, their records and checkpoints (the set-up is trainer_setup.cpp).
#include "kiln/trainer.hpp"

#include "trainer_impl.hpp"

namespace kiln {
namespace training {
namespace {

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

}  // namespace

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
    train_data_->recycle(std::move(*b));  // its memory may hold a later batch
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

}  // namespace training

using training::TrainingRun;

Trainer::Trainer(Session& s, std::ostream& out, RunInfo info) : s_(s), out_(out), info_(std::move(info)) {}

TrainReport Trainer::run() { return TrainingRun(s_, out_, info_).run(); }

}  // namespace kiln
