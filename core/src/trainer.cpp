// The training loop.
#include "kiln/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/memory_report.hpp"

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

class Progress {
 public:
  Progress(std::ostream& out, const std::string& mode, int64_t epoch, int64_t epochs, int64_t total)
      : out_(out), epoch_(epoch), epochs_(epochs), total_(total) {
    bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO) && &out == &std::cout);
    none_ = mode == "none";
    every_ = std::max<int64_t>(1, total > 0 ? total / 10 : 100);
  }
  void update(int64_t done, double loss, double ex_per_s, double s_per_batch, bool force = false) {
    if (none_) return;
    char stats[160];
    std::snprintf(stats, sizeof stats, "loss %.4f  %.0f examples/s  %.4f s/batch", loss, ex_per_s, s_per_batch);
    if (bar_) {
      const int width = 30;
      int filled = total_ > 0 ? static_cast<int>(width * done / total_) : 0;
      std::string b(static_cast<size_t>(filled), '=');
      if (filled < width) b += '>', b += std::string(static_cast<size_t>(width - filled - 1), ' ');
      out_ << "\repoch " << epoch_ << "/" << epochs_ << " [" << b << "] " << done << "/" << (total_ > 0 ? std::to_string(total_) : "?")
           << "  " << stats << "   " << std::flush;
    } else if (force || done % every_ == 0) {
      out_ << "epoch " << epoch_ << "/" << epochs_ << " batch " << done << "/" << (total_ > 0 ? std::to_string(total_) : "?")
           << "  " << stats << "\n" << std::flush;
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
};

}  // namespace

Evaluation evaluate(Runner& r, Stage& pipeline, const ModelSpec& m, bool use_ema) {
  pipeline.reset(0);
  Evaluation e;
  int64_t correct = 0;
  bool classify = false;
  for (const auto& o : m.outputs) classify = classify || o.loss != LossKind::mse;
  double loss_sum = 0;
  while (auto b = pipeline.next()) {
    EvalResult res = r.eval_batch(*b, use_ema);
    for (float l : res.losses) loss_sum += l;
    e.examples += b->batch;
    // Accuracy of the first classification head.
    for (size_t i = 0; i < m.outputs.size(); ++i) {
      if (m.outputs[i].loss == LossKind::mse) continue;
      const HostTensor& out = res.outputs[i];
      int64_t n = b->batch, cols = out.shape.numel() / std::max<int64_t>(n, 1);
      for (int64_t k = 0; k < n; ++k) {
        const float* row = out.data.data() + k * cols;
        if (m.outputs[i].loss == LossKind::softmax_cross_entropy) {
          int64_t best = 0;
          for (int64_t c = 1; c < cols; ++c)
            if (row[c] > row[best]) best = c;
          correct += best == static_cast<int64_t>(b->y.data[static_cast<size_t>(k)]);
        } else {  // binary: each column thresholded
          float thr = m.outputs[i].from_logits ? 0.f : 0.5f;
          bool ok = true;
          for (int64_t c = 0; c < cols; ++c)
            ok = ok && ((row[c] > thr) == (b->y.data[static_cast<size_t>(k * cols + c)] > 0.5f));
          correct += ok;
        }
      }
      break;
    }
  }
  if (e.examples > 0) {
    e.loss = loss_sum / static_cast<double>(e.examples);
    if (classify) e.accuracy = static_cast<double>(correct) / static_cast<double>(e.examples);
  }
  return e;
}

Trainer::Trainer(Session& s, std::ostream& out) : s_(s), out_(out) {}

TrainReport Trainer::run() {
  const auto& ts = s_.train();
  auto train_data = s_.make_pipeline("train");
  if (!train_data) throw ConfigError(s_.config().file() + ": missing [data.train] (stages = [...]) to train on");
  auto test_data = ts.evaluate ? s_.make_pipeline("test") : nullptr;
  // Labels as the data shapes them tell the model what its heads are trained against.
  s_.model().label_shape = train_data->label_shape();
  int64_t per_epoch = train_data->size_hint() > 0 ? (train_data->size_hint() + ts.batch_size - 1) / ts.batch_size : -1;
  if (ts.steps_per_epoch > 0) per_epoch = per_epoch > 0 ? std::min(per_epoch, ts.steps_per_epoch) : ts.steps_per_epoch;
  auto& sched = s_.optimizer().schedule;
  if (sched.kind == ScheduleKind::cosine && sched.total_steps == 0 && per_epoch > 0) sched.total_steps = per_epoch * ts.epochs;

  s_.open_devices();
  auto rctx = s_.runner_context();
  // Refuse up front, with the full plan report, when the plan cannot fit (memory_policy "fit" turns on savers first).
  if (ts.memory_policy != "none") {
    enforce_memory_plan(s_, out_);
    rctx = s_.runner_context();
  }
  auto runner = s_.strategy().create(rctx);
  if (!runner->report().empty()) out_ << runner->report();

  std::filesystem::create_directories(ts.output_dir);
  const std::string ckpt_path = ts.output_dir + "/checkpoint.kiln";
  const std::string metrics_path = ts.output_dir + "/metrics.jsonl";
  int64_t start_epoch = 0, step = 0;
  if (ts.resume && std::filesystem::exists(ckpt_path)) {
    Checkpoint c = load_checkpoint(ckpt_path);
    runner->load_state(c.tensors);
    start_epoch = c.epoch;
    step = c.step;
    out_ << "resumed from " << ckpt_path << " at epoch " << start_epoch << ", step " << step << "\n";
  }
  std::ofstream metrics(metrics_path, start_epoch > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics) throw Error(metrics_path + ": cannot open the metrics file for writing");

  TrainReport report;
  auto t_run = Clock::now();
  for (int64_t epoch = start_epoch; epoch < ts.epochs; ++epoch) {
    train_data->reset(static_cast<uint64_t>(epoch));
    Progress prog(out_, ts.progress, epoch + 1, ts.epochs, per_epoch);
    EpochMetrics em;
    em.epoch = epoch + 1;
    double loss_sum = 0, wait = 0;
    int64_t batches = 0, examples = 0;
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
    std::optional<Element> b = more(0) ? pull() : std::nullopt;
    while (b) {
      std::optional<Element> nb;
      if (more(batches + 1)) {
        nb = pull();
        if (nb && ts.device_prefetch) runner->prefetch(*nb);
      }
      StepScalars sc{step, static_cast<float>(s_.optimizer().learning_rate_at(step))};
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
      examples += b->batch;
      ++batches;
      ++step;
      double el = secs(t0, Clock::now());
      prog.update(batches, loss_sum / static_cast<double>(examples), static_cast<double>(examples) / el, el / static_cast<double>(batches));
      b = std::move(nb);
    }
    em.seconds = secs(t0, Clock::now());
    em.train_loss = examples ? loss_sum / static_cast<double>(examples) : 0;
    em.examples_per_s = em.seconds > 0 ? static_cast<double>(examples) / em.seconds : 0;
    em.s_per_batch = batches ? em.seconds / static_cast<double>(batches) : 0;
    em.input_wait_fraction = em.seconds > 0 ? wait / em.seconds : 0;
    prog.update(batches, em.train_loss, em.examples_per_s, em.s_per_batch, true);
    prog.finish();
    if (test_data) {
      Evaluation ev = evaluate(*runner, *test_data, s_.model(), s_.optimizer().ema_decay > 0);
      em.test_loss = ev.loss;
      em.test_accuracy = ev.accuracy;
    }
    std::ostringstream line;
    line << "epoch " << em.epoch << "/" << ts.epochs << ": train loss " << std::fixed << std::setprecision(4) << em.train_loss;
    if (em.test_loss >= 0) line << ", test loss " << em.test_loss;
    if (em.test_accuracy >= 0) line << ", test accuracy " << em.test_accuracy;
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
            << ",\"s_per_batch\":" << json_num(em.s_per_batch) << ",\"input_wait_fraction\":" << json_num(em.input_wait_fraction)
            << "}\n" << std::flush;
    report.epochs.push_back(em);
    if (ts.checkpoint_every > 0 && ((epoch + 1) % ts.checkpoint_every == 0 || epoch + 1 == ts.epochs)) {
      Checkpoint c;
      c.epoch = epoch + 1;
      c.step = step;
      c.tensors = runner->save_state();
      save_checkpoint(ckpt_path, c);
    }
  }
  report.seconds = secs(t_run, Clock::now());
  report.steps = step;
  return report;
}

}  // namespace kiln
