// The training loop.
#include "kiln/trainer.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/memory_report.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "evaluation.hpp"
#include "run_dir.hpp"
#include "run_ranks.hpp"
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

// ---- SIGINT / SIGTERM: finish the step, checkpoint, exit ----

std::atomic<int> g_stop_signal{0};

extern "C" void kiln_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) {  // the second signal stops at once
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  static const char msg[] = "\nkiln: stopping after the current step and writing a checkpoint (press Ctrl-C again to stop at once)\n";
  ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)n;
}

// Installs the handlers for the duration of a run and puts the previous ones back. The handler runs on an alternate
// signal stack of the installing thread (the main thread, which is also a CPU device's first pool thread). With
// GEMMs through oneDNN's sgemm, a stop signal delivered on the threads' own stacks corrupted the heap in 4 of 30
// runs of the SIGTERM test (presumably its JIT kernels use stack below their stack pointer, where the signal frame
// goes); with the handler on this stack and the CPU backend's workers blocking these signals, 0 of 40.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    stack_t ss {};
    ss.ss_sp = alt_stack_;
    ss.ss_size = sizeof alt_stack_;
    on_alt_stack_ = ::sigaltstack(&ss, &old_stack_) == 0;
    struct sigaction sa {};
    sa.sa_handler = kiln_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (on_alt_stack_ ? SA_ONSTACK : 0);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    if (on_alt_stack_) ::sigaltstack(&old_stack_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
  stack_t old_stack_ {};
  bool on_alt_stack_ = false;
  alignas(16) char alt_stack_[65536];
};

class Progress {
 public:
  Progress(std::ostream& out, const std::string& mode, int64_t epoch, int64_t epochs, int64_t total)
      : out_(out), epoch_(epoch), epochs_(epochs), total_(total) {
    bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO) && &out == &std::cout);
    none_ = mode == "none";
    every_ = std::max<int64_t>(1, total > 0 ? total / 10 : 100);
  }
  // `extra`: per-head losses and the gradient norm, when there are any.
  void update(int64_t done, double loss, double ex_per_s, double s_per_batch, bool force = false,
              const std::string& extra = {}) {
    if (none_) return;
    if (!bar_ && done == last_printed_) return;  // the forced line at the epoch's end may repeat the last one
    char stats[200];
    // Slow models run below one example per second: show what is there instead of "0 examples/s".
    std::snprintf(stats, sizeof stats, ex_per_s >= 10 ? "loss %.4f  %.0f examples/s  %.4f s/batch" : "loss %.4f  %.3g examples/s  %.4f s/batch",
                  loss, ex_per_s, s_per_batch);
    std::string eta = extra;
    if (total_ > 0 && done < total_ && s_per_batch > 0) {
      const double left = static_cast<double>(total_ - done) * s_per_batch;
      char e[64];
      if (left >= 3600) std::snprintf(e, sizeof e, "  eta %dh%02dm", static_cast<int>(left / 3600), static_cast<int>(left / 60) % 60);
      else if (left >= 60) std::snprintf(e, sizeof e, "  eta %dm%02ds", static_cast<int>(left / 60), static_cast<int>(left) % 60);
      else std::snprintf(e, sizeof e, "  eta %.0fs", left);
      eta += e;
    }
    if (bar_) {
      const int width = 30;
      int filled = total_ > 0 ? static_cast<int>(width * done / total_) : 0;
      std::string b(static_cast<size_t>(filled), '=');
      if (filled < width) b += '>', b += std::string(static_cast<size_t>(width - filled - 1), ' ');
      out_ << "\repoch " << epoch_ << "/" << epochs_ << " [" << b << "] " << done << "/" << (total_ > 0 ? std::to_string(total_) : "?")
           << "  " << stats << eta << "   " << std::flush;
    } else if (force || done % every_ == 0) {
      out_ << "epoch " << epoch_ << "/" << epochs_ << " batch " << done << "/" << (total_ > 0 ? std::to_string(total_) : "?")
           << "  " << stats << eta << "\n" << std::flush;
      last_printed_ = done;
    }
  }
  void finish() {
    if (bar_) out_ << "\n";
  }

 private:
  std::ostream& out_;
  int64_t epoch_, epochs_, total_;
  bool bar_ = false, none_ = false;
  int64_t every_;
  int64_t last_printed_ = -1;
};

}  // namespace

Trainer::Trainer(Session& s, std::ostream& out, RunInfo info) : s_(s), out_(out), info_(std::move(info)) {}

TrainReport Trainer::run() {
  const auto& ts = s_.train();
  // Across processes (e.g. MPI ranks) every rank trains; rank 0 alone writes the run directory (the host prints only
  // rank 0's output). Ranks started with different configs are refused before anything else.
  ProcessGroup* pg = s_.strategy().process_group();
  const bool lead = !pg || pg->rank() == 0;
  if (pg && pg->size() > 1) check_same_config(*pg, s_.config().resolved_text(), s_.config().file());
  const std::string dir_key = check_output_dir(s_);
  std::unique_ptr<Stage> train_data = s_.make_pipeline("train");
  if (!train_data) throw ConfigError(s_.config().file() + ": missing [data.train] (stages = [...]) to train on");
  std::unique_ptr<Stage> test_data = ts.evaluate ? s_.make_pipeline("test") : nullptr;
  // Labels as the data shapes them tell the model what its heads are trained against.
  s_.model().label_shape = train_data->label_shape();
  // Every batch, train and test, is checked against what the losses accept before it reaches a device.
  const LabelRules rules = label_rules(s_.model());
  train_data = checked_stage(std::move(train_data), rules, describe_source(s_.config(), "train"));
  if (test_data) test_data = checked_stage(std::move(test_data), rules, describe_source(s_.config(), "test"));
  int64_t per_epoch = train_data->size_hint() > 0 ? (train_data->size_hint() + ts.batch_size - 1) / ts.batch_size : -1;
  if (ts.steps_per_epoch > 0) per_epoch = per_epoch > 0 ? std::min(per_epoch, ts.steps_per_epoch) : ts.steps_per_epoch;
  auto& sched = s_.optimizer().schedule;
  if (sched.kind == ScheduleKind::cosine && sched.total_steps == 0 && per_epoch > 0)
    sched.total_steps = std::max<int64_t>(per_epoch * ts.epochs - sched.warmup_steps, 1);  // the rest of the run

  // The run directory belongs to this process until it ends (a second `kiln train` of the same run is refused, naming
  // this one), and an earlier run in it is refused before any device memory is taken.
  std::optional<RunLock> lock;
  if (lead) {
    create_output_dir(ts.output_dir, dir_key);
    lock.emplace(ts.output_dir, dir_key, info_.command.empty() ? "kiln train " + s_.config().file() : info_.command);
  }
  const PriorRun prior = inspect_run_dir(ts.output_dir);
  if (lead && !ts.resume && !ts.overwrite && prior.exists())
    throw ConfigError(ts.output_dir + " already holds a run (" +
                      (prior.checkpoint ? std::string("checkpoint.kiln, ") : std::string()) + "metrics.jsonl with " +
                      std::to_string(prior.metric_lines) + " records); it is not overwritten silently: pass --resume (or [train] "
                      "resume = true) to continue it, --overwrite (or [train] overwrite = true) to start it over, or give "
                      "this run another [run] name or output directory (" + dir_key + ")");

  s_.open_devices();
  // Say what the run uses before it uses it: backend, device and memory limit of every device (issue 15 item 14).
  for (const DeviceContext& d : s_.devices()) {
    const DeviceInfo& info = d.device->info();
    out_ << "device " << info.label() << ": " << info.name << ", memory limit "
         << (d.allocator ? format_bytes(d.allocator->limit()) : std::string("none"))
         << (d.allocator && d.allocator->options().growth ? " (growth on demand)" : " (reserved at start)")
         << (s_.explicit_limit() ? " from [device] memory_limit" : "") << "\n";
  }
  auto rctx = s_.runner_context();
  // Refuse up front, with the full plan report, when the plan cannot fit (memory_policy "fit" turns on savers first).
  if (ts.memory_policy != "none") {
    enforce_memory_plan(s_, out_);
    rctx = s_.runner_context();
  }
  auto runner = s_.strategy().create(rctx);
  if (!runner->report().empty()) out_ << runner->report();

  const std::string ckpt_path = ts.output_dir + "/checkpoint.kiln";
  const std::string metrics_path = ts.output_dir + "/metrics.jsonl";
  int64_t start_epoch = 0, step = 0;
  bool resumed = false;
  std::optional<Position> resume_at;  // a mid-epoch checkpoint's position inside epoch start_epoch
  if (ts.resume && prior.checkpoint) {
    // The run continues only with the model, data and optimizer it was started with (config.toml of the run).
    std::ifstream saved_cfg(ts.output_dir + "/config.toml");
    if (saved_cfg) {
      const std::string saved((std::istreambuf_iterator<char>(saved_cfg)), std::istreambuf_iterator<char>());
      const auto changed = resume_incompatible_keys(saved, s_.config().resolved_text());
      if (!changed.empty()) {
        std::string list;
        for (const auto& c : changed) list += "\n  " + c;
        throw ConfigError(s_.config().file() + ": cannot resume the run in " + ts.output_dir + ": these keys differ from " +
                          ts.output_dir + "/config.toml, the configuration it was started with:" + list +
                          "\nResume with the same values, or start over with --overwrite (keys that may change on a resume "
                          "are listed in docs/user_guide.md, \"Stopping and resuming\")");
      }
    }
    // The newest checkpoint that loads: a damaged one falls back to the one before ([train] keep_checkpoints).
    LoadedCheckpoint lc = load_newest_checkpoint(ckpt_path);
    if (!lc.warning.empty()) out_ << lc.warning << "\n";
    Checkpoint& c = lc.checkpoint;
    runner->load_state(c.tensors);
    start_epoch = c.epoch;
    step = c.step;
    resumed = true;
    if (!c.data_state.empty()) resume_at = decode_position(c.data_state, lc.path);
    out_ << "resumed from " << lc.path << " at epoch " << start_epoch + (resume_at ? 1 : 0) << ", step " << step;
    if (resume_at) out_ << " (mid-epoch: " << resume_at->batches << " batches of epoch " << start_epoch + 1 << " done)";
    out_ << "\n";
    // Records written after that checkpoint (the run was stopped before its next one) are written again below.
    if (int64_t dropped = lead ? trim_metrics(metrics_path, step) : 0; dropped > 0)
      out_ << "metrics.jsonl: dropped " << dropped << " record(s) written after the checkpoint's step " << step
           << "; this run writes them again\n";
  } else if (ts.resume) {
    out_ << "nothing to resume: " << ts.output_dir << " holds no checkpoint.kiln"
         << (prior.metric_lines > 0 ? " (its metrics.jsonl is started over)" : "") << "; starting a new run\n";
  } else if (lead && prior.exists()) {
    remove_checkpoints(ckpt_path);  // --overwrite: nothing of the old run may be resumed into the new one
    out_ << "overwriting the earlier run in " << ts.output_dir << "\n";
  }
  if (lead) {
    std::ostringstream rj;
    rj << "{\"kiln_version\":" << json_string(KILN_VERSION_STRING) << ",\"plugin_api\":" << kApiVersion
       << ",\"config_file\":" << json_string(s_.config().file()) << ",\"command\":" << json_string(info_.command)
       << ",\"run\":" << json_string(s_.run_name()) << ",\"seed\":" << s_.seed() << ",\"resumed_at_step\":"
       << (resumed ? std::to_string(step) : std::string("null")) << ",\"plugins\":[";
    for (size_t i = 0; i < info_.plugins.size(); ++i) rj << (i ? "," : "") << json_string(info_.plugins[i]);
    rj << "],\"devices\":[";
    for (size_t i = 0; i < s_.devices().size(); ++i) {
      const DeviceInfo& d = s_.devices()[i].device->info();
      rj << (i ? "," : "") << "{\"device\":" << json_string(d.label()) << ",\"name\":" << json_string(d.name)
         << ",\"memory_limit\":" << (s_.devices()[i].allocator ? std::to_string(s_.devices()[i].allocator->limit()) : "null") << "}";
    }
    rj << "],\"strategy\":" << json_string(s_.strategy().name()) << "}";
    write_run_record(ts.output_dir, s_.config().resolved_text(), rj.str());
  }
  // A text source's vocabulary goes with the run, so `kiln sample` decodes what the model writes.
  if (lead && !s_.vocabulary().empty()) {
    const std::string vpath = ts.output_dir + "/vocab.json", tmp = vpath + ".tmp";
    {
      std::ofstream v(tmp, std::ios::trunc);
      v << s_.vocabulary() << "\n";
      if (!v) throw Error(tmp + ": cannot write the vocabulary (the output directory comes from " + dir_key + ")");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, vpath, ec);
    if (ec) throw Error(vpath + ": cannot write the vocabulary: " + ec.message());
  }
  std::ofstream metrics;  // rank 0's alone; the other ranks' writes go nowhere
  if (lead) metrics.open(metrics_path, resumed ? std::ios::app : std::ios::trunc);
  if (lead && !metrics)
    throw Error(metrics_path + ": cannot open the metrics file for writing (the output directory comes from " + dir_key +
                ")");
  // [log] tensorboard: the same scalars as metrics.jsonl, in a new event file per process (TensorBoard reads them all).
  std::unique_ptr<TensorBoardWriter> tb;
  if (ts.tensorboard && lead) tb = std::make_unique<TensorBoardWriter>(ts.output_dir);

  TrainReport report;
  auto t_run = Clock::now();
  StopSignals signals;
  auto last_checkpoint = Clock::now();
  auto write_checkpoint = [&](Checkpoint& c) {
    c.tensors = runner->save_state();  // every rank: it may gather the optimizer state's shards
    if (!lead) return;
    try {
      save_checkpoint(ckpt_path, c, ts.keep_checkpoints);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (the output directory comes from " + dir_key + ")");
    }
    last_checkpoint = Clock::now();
  };
  // [train] checkpoint_every_steps / checkpoint_every_minutes: due after the step just done.
  auto checkpoint_due = [&] {
    return (ts.checkpoint_every_steps > 0 && step % ts.checkpoint_every_steps == 0) ||
           (ts.checkpoint_every_minutes > 0 && secs(last_checkpoint, Clock::now()) >= 60 * ts.checkpoint_every_minutes);
  };
  // [train] early_stopping: the best value of its metric so far and the epochs since (rebuilt from metrics.jsonl's
  // epoch records on a resume, so a resumed run stops where an uninterrupted one would).
  const EarlyStopping& es = ts.early_stopping;
  const bool es_max = es.metric == "test_accuracy";
  double es_best = 0;
  int64_t es_best_epoch = 0, es_wait = 0;
  const std::string best_path = ts.output_dir + "/checkpoint-best.kiln";
  auto es_observe = [&](double v, int64_t epoch_1) {  // returns true when the run should stop
    if (es_best_epoch == 0 || (es_max ? v > es_best + es.min_delta : v < es_best - es.min_delta)) {
      es_best = v;
      es_best_epoch = epoch_1;
      es_wait = 0;
      return false;
    }
    return ++es_wait >= es.patience;
  };
  if (es.on) {
    if (es.metric != "train_loss" && !test_data)
      throw ConfigError(s_.config().file() + ": [train] early_stopping watches " + es.metric +
                        ", which needs an evaluation: add [data.test] and keep [train] evaluate = true, or watch train_loss");
    if (resumed) {
      std::ifstream old(metrics_path);
      const std::regex re("\"epoch\":([0-9]+).*\"" + es.metric + "\":([-0-9.eE+]+)");
      for (std::string l; std::getline(old, l);) {
        std::smatch m;
        if (l.find("\"event\":\"epoch\"") != std::string::npos && std::regex_search(l, m, re))
          es_observe(std::stod(m[2]), std::stoll(m[1]));
      }
    }
  }
  if (ts.max_steps > 0 && step >= ts.max_steps) {
    out_ << "nothing to train: the run is at step " << step << " and [train] max_steps is " << ts.max_steps
         << " (raise it, or set it to 0, to continue)\n";
    report.steps = step;
    return report;
  }
  for (int64_t epoch = start_epoch; epoch < ts.epochs; ++epoch) {
    train_data->reset(static_cast<uint64_t>(epoch));
    Progress prog(out_, ts.progress, epoch + 1, ts.epochs, per_epoch);
    EpochMetrics em;
    em.epoch = epoch + 1;
    double loss_sum = 0, wait = 0, norm_sum = 0;
    int64_t batches = 0, examples = 0, norms = 0;
    std::vector<double> head_sum(s_.model().outputs.size(), 0.0);
    std::optional<Element> pending;  // a resumed position's batch that the pipeline had already delivered
    if (resume_at) {
      train_data->restore(resume_at->pipeline);
      batches = resume_at->batches;
      examples = resume_at->examples;
      loss_sum = resume_at->loss_sum;
      norm_sum = resume_at->norm_sum;
      norms = resume_at->norms;
      if (resume_at->head_sum.size() == head_sum.size()) head_sum = resume_at->head_sum;
      pending = std::move(resume_at->pending);
      resume_at.reset();
    }
    // Per-head losses (several outputs) and the gradient norm ([optimizer] clip_norm), for the progress line.
    auto extra = [&]() {
      std::ostringstream os;
      os << std::fixed << std::setprecision(4);
      if (head_sum.size() > 1 && examples > 0)
        for (size_t i = 0; i < head_sum.size(); ++i)
          os << "  " << s_.model().outputs[i].layer << " " << head_sum[i] / static_cast<double>(examples);
      if (norms > 0) os << "  grad_norm " << norm_sum / static_cast<double>(norms);
      return os.str();
    };
    auto t0 = Clock::now();
    // One batch of lookahead: batch k+1 is handed to runner->prefetch() before step k runs, so its copy into the
    // device's second input buffer overlaps step k ([train] device_prefetch).
    auto more = [&](int64_t k) { return ts.steps_per_epoch == 0 || k < ts.steps_per_epoch; };
    auto pull = [&]() {
      auto tw = Clock::now();
      auto e = train_data->next();
      wait += secs(tw, Clock::now());
      return e;
    };
    // A resumed position starts with the batch its pipeline had already delivered (copied in its step, like an
    // epoch's first batch).
    std::optional<Element> b = pending ? std::move(pending) : more(batches) ? pull() : std::nullopt;
    pending.reset();
    while (b) {
      std::optional<Element> nb;
      if (more(batches + 1)) {
        nb = pull();
        if (nb && ts.device_prefetch) runner->prefetch(*nb);
      }
      StepScalars sc{step, static_cast<float>(s_.optimizer().learning_rate_at(step))};
      if (!report.first_step_start) report.first_step_start = Clock::now();
      StepResult r = runner->train_step(*b, sc);
      if (!std::isfinite(r.total_loss)) {
        prog.finish();
        metrics.flush();
        std::string layer = runner->find_nonfinite_layer(*b, step);
        std::ostringstream os;
        os << "training stopped: the loss is " << r.total_loss << " at step " << step << " (epoch " << epoch + 1 << ", batch "
           << batches + 1 << "); "
           << (layer.empty() ? "every layer output is finite, so the loss itself overflowed (check labels and learning rate)"
                             : "the first layer whose output is non-finite is '" + layer + "'")
           << ". The weights were not updated by this step; the last checkpoint and metrics are intact.";
        throw NumericError(os.str());
      }
      loss_sum += r.total_loss * static_cast<double>(b->batch);
      for (size_t i = 0; i < r.losses.size() && i < head_sum.size(); ++i)
        head_sum[i] += static_cast<double>(r.losses[i]) * static_cast<double>(b->batch);
      if (r.grad_norm >= 0) norm_sum += r.grad_norm, ++norms;
      examples += b->batch;
      ++batches;
      ++step;
      double el = secs(t0, Clock::now());
      if (ts.log_every_steps > 0 && step % ts.log_every_steps == 0) {
        // One record per logged step: the loss of this step (each head's, weighted, beside the total), the learning
        // rate it used, the epoch's throughput so far and the device memory in use (the first device's allocator).
        metrics << "{\"event\":\"step\",\"epoch\":" << epoch + 1 << ",\"step\":" << step << ",\"loss\":" << json_num(r.total_loss);
        const auto& outs = s_.model().outputs;
        if (outs.size() > 1 && r.losses.size() == outs.size()) {
          metrics << ",\"losses\":{";
          for (size_t h = 0; h < outs.size(); ++h) metrics << (h ? "," : "") << json_string(outs[h].layer) << ":" << json_num(r.losses[h]);
          metrics << "}";
        }
        if (r.grad_norm >= 0) metrics << ",\"grad_norm\":" << json_num(r.grad_norm);
        metrics << ",\"learning_rate\":" << json_num(sc.lr)
                << ",\"examples_per_s\":" << json_num(el > 0 ? static_cast<double>(examples) / el : 0);
        if (!s_.devices().empty() && s_.devices().front().allocator)
          metrics << ",\"device_memory_in_use\":" << s_.devices().front().allocator->stats().in_use;
        metrics << "}\n";
        if (tb) {
          std::vector<std::pair<std::string, double>> v{{"loss", r.total_loss}, {"learning_rate", sc.lr}};
          if (r.grad_norm >= 0) v.emplace_back("grad_norm", r.grad_norm);
          tb->scalars(step, v);
        }
      }
      prog.update(batches, loss_sum / static_cast<double>(examples), static_cast<double>(examples) / el,
                  el / static_cast<double>(batches), false, extra());
      b = std::move(nb);
      // A mid-epoch checkpoint after this step: asked for by a signal, by max_steps, or due by steps or minutes. It
      // holds the position inside the epoch (the pipeline's state and the batch already pulled), so a resumed run
      // continues with exactly the batches this one would have trained on.
      int stop_signal = g_stop_signal.load();
      const bool at_max = ts.max_steps > 0 && step >= ts.max_steps;
      bool due = checkpoint_due();
      if (pg && pg->size() > 1) {  // every rank stops and checkpoints after the same step
        const StepAgreement a = agree_after_step(*pg, stop_signal, due);
        stop_signal = a.stop_signal;
        due = a.checkpoint_due;
      }
      if ((stop_signal != 0 || at_max || due) && b) {
        Position here;
        here.batches = batches;
        here.examples = examples;
        here.loss_sum = loss_sum;
        here.norm_sum = norm_sum;
        here.norms = norms;
        here.head_sum = head_sum;
        here.pipeline = train_data->save();
        here.pending = b;
        Checkpoint c;
        c.epoch = epoch;
        c.step = step;
        c.data_state = encode_position(here);
        metrics.flush();
        write_checkpoint(c);
      }
      if ((stop_signal != 0 || at_max) && b) {
        prog.finish();
        metrics.flush();
        const std::string resume_cmd = "kiln train " + s_.config().file() + " --resume";
        if (stop_signal != 0) {
          std::ostringstream os;
          os << "stopped by " << (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << " after step " << step << " (epoch "
             << epoch + 1 << ", batch " << batches << "); checkpoint written to " << ckpt_path << "; resume with: " << resume_cmd;
          throw Interrupted(os.str(), stop_signal);
        }
        out_ << "stopped at max_steps = " << ts.max_steps << " (epoch " << epoch + 1 << ", batch " << batches
             << "); checkpoint written to " << ckpt_path << "; continue with: " << resume_cmd << " --set train.max_steps=0\n";
        report.seconds = secs(t_run, Clock::now());
        report.steps = step;
        return report;
      }
    }
    em.seconds = secs(t0, Clock::now());
    em.train_loss = examples ? loss_sum / static_cast<double>(examples) : 0;
    em.examples_per_s = em.seconds > 0 ? static_cast<double>(examples) / em.seconds : 0;
    em.s_per_batch = batches ? em.seconds / static_cast<double>(batches) : 0;
    em.input_wait_fraction = em.seconds > 0 ? wait / em.seconds : 0;
    em.grad_norm = norms > 0 ? norm_sum / static_cast<double>(norms) : -1;
    for (double h : head_sum) em.train_losses.push_back(examples ? h / static_cast<double>(examples) : 0);
    prog.update(batches, em.train_loss, em.examples_per_s, em.s_per_batch, true, extra());
    prog.finish();
    if (test_data) {
      Evaluation ev = evaluate(*runner, *test_data, s_.model(), s_.optimizer().ema_decay > 0);
      em.test_loss = ev.loss;
      em.test_accuracy = ev.accuracy;
      em.test_losses = ev.losses;
      em.test_accuracies = ev.accuracies;
    }
    const auto& heads = s_.model().outputs;
    auto per_head = [&](const std::vector<double>& v, bool skip_negative) {  // {"digit": 0.31, "parity": 0.05}
      std::string j = "{";
      for (size_t i = 0; i < v.size() && i < heads.size(); ++i) {
        if (j.size() > 1) j += ",";
        j += "\"" + heads[i].layer + "\":" + (skip_negative && v[i] < 0 ? std::string("null") : json_num(v[i]));
      }
      return j + "}";
    };
    std::ostringstream line;
    line << "epoch " << em.epoch << "/" << ts.epochs << ": train loss " << std::fixed << std::setprecision(4) << em.train_loss;
    if (em.test_loss >= 0) line << ", test loss " << em.test_loss;
    if (em.test_accuracy >= 0) line << ", test accuracy " << em.test_accuracy;
    if (heads.size() > 1) {
      line << " (";
      for (size_t i = 0; i < heads.size(); ++i) {
        line << (i ? "; " : "") << heads[i].layer << ": train loss " << em.train_losses[i];
        if (i < em.test_losses.size()) line << ", test loss " << em.test_losses[i];
        if (i < em.test_accuracies.size() && em.test_accuracies[i] >= 0) line << ", test accuracy " << em.test_accuracies[i];
      }
      line << ")";
    }
    if (em.grad_norm >= 0) line << ", grad_norm " << em.grad_norm;
    line << std::setprecision(1) << ", " << em.seconds << " s, " << std::setprecision(0) << em.examples_per_s << " examples/s, "
         << std::setprecision(4) << em.s_per_batch << " s/batch, input-bound: " << std::setprecision(0)
         << em.input_wait_fraction * 100 << "% of step time";
    out_ << line.str() << "\n";
    // Per-replica / per-device throughput of multi-device strategies.
    if (std::string rep = runner->report(); !rep.empty()) out_ << rep;
    out_ << std::flush;
    metrics << "{\"event\":\"epoch\",\"epoch\":" << em.epoch << ",\"step\":" << step << ",\"train_loss\":" << json_num(em.train_loss)
            << ",\"test_loss\":" << (em.test_loss >= 0 ? json_num(em.test_loss) : "null")
            << ",\"test_accuracy\":" << (em.test_accuracy >= 0 ? json_num(em.test_accuracy) : "null")
            << ",\"seconds\":" << json_num(em.seconds) << ",\"examples_per_s\":" << json_num(em.examples_per_s)
            << ",\"s_per_batch\":" << json_num(em.s_per_batch) << ",\"input_wait_fraction\":" << json_num(em.input_wait_fraction);
    if (em.grad_norm >= 0) metrics << ",\"grad_norm\":" << json_num(em.grad_norm);
    if (heads.size() > 1) {
      metrics << ",\"train_losses\":" << per_head(em.train_losses, false);
      if (!em.test_losses.empty())
        metrics << ",\"test_losses\":" << per_head(em.test_losses, false)
                << ",\"test_accuracies\":" << per_head(em.test_accuracies, true);
    }
    metrics << "}\n" << std::flush;
    if (tb) {
      std::vector<std::pair<std::string, double>> v{{"train_loss", em.train_loss}};
      if (em.test_loss >= 0) v.emplace_back("test_loss", em.test_loss);
      if (em.test_accuracy >= 0) v.emplace_back("test_accuracy", em.test_accuracy);
      if (em.grad_norm >= 0) v.emplace_back("epoch_grad_norm", em.grad_norm);
      tb->scalars(step, v);
      tb->flush();
    }
    report.epochs.push_back(em);
    bool es_stop = false;
    if (es.on) {
      const double v = es.metric == "train_loss" ? em.train_loss : es.metric == "test_loss" ? em.test_loss : em.test_accuracy;
      const int64_t before = es_best_epoch;
      es_stop = es_observe(v, epoch + 1) && epoch + 1 < ts.epochs;
      if (es.restore_best && es_best_epoch != before) {  // a new best: keep its weights
        Checkpoint c;
        c.epoch = epoch + 1;
        c.step = step;
        c.tensors = runner->save_state();
        if (lead) save_checkpoint(best_path, c);
      }
      if (es_stop) {
        out_ << "early stopping after epoch " << epoch + 1 << ": " << es.metric << " has not improved by more than "
             << es.min_delta << " for " << es.patience << " epoch(s); the best was " << es_best << " at epoch " << es_best_epoch;
        if (es.restore_best && es_best_epoch != epoch + 1) {
          runner->load_state(load_checkpoint(best_path).tensors);
          out_ << " (its weights are restored, from " << best_path << ")";
        }
        out_ << "\n";
      }
    }
    int stop_signal = g_stop_signal.load();
    const bool at_max = ts.max_steps > 0 && step >= ts.max_steps;
    bool due = checkpoint_due();
    if (pg && pg->size() > 1) {
      const StepAgreement a = agree_after_step(*pg, stop_signal, due);
      stop_signal = a.stop_signal;
      due = a.checkpoint_due;
    }
    if (es_stop) {  // the final checkpoint holds the weights the run ends with
      Checkpoint c;
      c.epoch = epoch + 1;
      c.step = step;
      write_checkpoint(c);
      break;
    }
    if ((ts.checkpoint_every > 0 && ((epoch + 1) % ts.checkpoint_every == 0 || epoch + 1 == ts.epochs)) ||
        ((stop_signal != 0 || at_max) && epoch + 1 < ts.epochs) || due) {
      Checkpoint c;
      c.epoch = epoch + 1;
      c.step = step;
      write_checkpoint(c);
    }
    if ((stop_signal != 0 || at_max) && epoch + 1 < ts.epochs) {
      const std::string resume_cmd = "kiln train " + s_.config().file() + " --resume";
      if (stop_signal != 0)
        throw Interrupted("stopped by " + std::string(stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + " after epoch " +
                              std::to_string(epoch + 1) + " (step " + std::to_string(step) + "); checkpoint written to " +
                              ckpt_path + "; resume with: " + resume_cmd,
                          stop_signal);
      out_ << "stopped at max_steps = " << ts.max_steps << " after epoch " << epoch + 1 << "; checkpoint written to "
           << ckpt_path << "; continue with: " << resume_cmd << " --set train.max_steps=0\n";
      break;
    }
  }
  report.seconds = secs(t_run, Clock::now());
  report.steps = step;
  return report;
}

}  // namespace kiln
