// Evaluation over a whole pipeline, the label rules every batch is checked against, and the name of a data source
// in error messages.
#include "evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/evaluation.hpp"
#include "kiln/graph.hpp"
#include "kiln/session.hpp"

namespace kiln {

// Declared in session.hpp (config-time data checks name the source too).
std::string describe_source(const Config& cfg, const std::string& split) {
  std::string out = "[data." + split + "]";
  try {
    auto d = cfg.root().table("data");
    auto p = d ? d->table(split) : std::nullopt;
    auto stages = p ? p->table_array("stages") : std::vector<ConfigNode>{};
    if (stages.empty()) return out;
    out += " (" + stages[0].get_string("type", "?") + " source";
    for (const char* key : {"images", "labels", "path", "dir"}) {
      if (!stages[0].has(key)) continue;
      std::filesystem::path f = stages[0].get_string(key);
      if (f.is_relative() && !cfg.base_dir().empty()) f = std::filesystem::path(cfg.base_dir()) / f;
      out += std::string(", ") + key + " = '" + f.string() + "'";
    }
    if (stages[0].has("files")) {
      std::string files;
      for (const auto& f : stages[0].get_string_list("files", {})) files += (files.empty() ? "'" : ", '") + f + "'";
      out += ", files = [" + files + "]";
    }
    out += ")";
  } catch (const ConfigError&) {  // a key of another type: the section name alone still says where
  }
  return out;
}

namespace {

// Where output `o`'s label sits in each example's label values: its named label's column, or -1 (the whole label).
int64_t label_column(const ModelSpec& m, const OutputSpec& o) {
  if (o.label.empty()) return -1;
  auto it = std::find(m.label_names.begin(), m.label_names.end(), o.label);
  return it == m.label_names.end() ? -1 : it - m.label_names.begin();
}

}  // namespace

LabelRules label_rules(const ModelSpec& m) {
  LabelRules r;
  bool any = false;
  for (const auto& o : m.outputs) any = any || o.loss != LossKind::mse;
  if (!any) return r;
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  Graph g = build_graph(m, go);  // only to learn each head's width; nothing is allocated
  r.soft = g.soft_labels;
  if (!m.outputs.empty() && !m.outputs[0].label.empty()) {
    r.names = m.label_names.size();
    for (size_t i = 0; i < m.outputs.size() && i < g.outputs.size(); ++i) {
      const Shape& os = g.tensor(g.outputs[i]).shape;
      LabelRules::Field f;
      f.col = static_cast<size_t>(std::max<int64_t>(label_column(m, m.outputs[i]), 0));
      f.classes = m.outputs[i].loss == LossKind::softmax_cross_entropy ? os[os.rank() - 1] : 0;
      f.unit = m.outputs[i].loss == LossKind::binary_cross_entropy;
      f.output = m.outputs[i].layer;
      f.label = m.outputs[i].label;
      r.fields.push_back(f);
    }
    return r;
  }
  for (size_t i = 0; i < m.outputs.size() && i < g.outputs.size(); ++i) {
    const Shape& os = g.tensor(g.outputs[i]).shape;
    // A classifier's classes are its logits' last dim ((1, classes), or (1, T, classes) for a sequence).
    const int64_t cols = m.outputs[i].loss == LossKind::softmax_cross_entropy ? os[os.rank() - 1] : os.numel();
    if (m.outputs[i].loss == LossKind::softmax_cross_entropy && (r.classes == 0 || cols < r.classes)) {
      r.classes = cols;
      r.ce_output = m.outputs[i].layer;
    }
    if (m.outputs[i].loss == LossKind::binary_cross_entropy && !r.unit) {
      r.unit = true;
      r.bce_output = m.outputs[i].layer;
    }
  }
  return r;
}

namespace {

// Passes a pipeline's batches through unchanged after checking their inputs and labels; a bad value is a
// DataError naming the source, the example (its position in the epoch as delivered) and the value.
// Whether n floats are all finite: an exponent of all ones marks an infinity or a NaN. Checked as integers, without
// a branch per value, so the check vectorizes: it runs on every input value of every batch before the step. The core
// is built for any x86-64 (SSE2); an AVX2 copy, chosen when the process starts, checks 8 values an instruction.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__APPLE__)
__attribute__((target_clones("avx2", "default")))
#endif
bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits = 0;
    std::memcpy(&bits, x + j, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

class CheckedStage final : public Stage {
 public:
  CheckedStage(std::unique_ptr<Stage> up, LabelRules rules, std::string source, int64_t rows_begin, int64_t rows_end,
               int64_t batch)
      : up_(std::move(up)),
        rules_(std::move(rules)),
        source_(std::move(source)),
        rows_begin_(rows_begin),
        rows_end_(rows_end),
        batch_(batch) {}

  std::string name() const override { return up_->name(); }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }
  StageState save() const override { return up_->save(); }
  void restore(const StageState& s) override {
    up_->restore(s);
    seen_known_ = false;
  }
  void collect_stats(std::vector<StageStats>& out) const override { up_->collect_stats(out); }
  void reset(uint64_t epoch) override {
    up_->reset(epoch);
    epoch_ = epoch;
    seen_ = 0;
    seen_known_ = true;
  }

  std::optional<Element> next() override {
    auto b = up_->next();
    if (b) check(*b);
    return b;
  }
  void recycle(Element&& e) override { up_->recycle(std::move(e)); }

 private:
  void check(const Element& b) {
    const int64_t n = std::max<int64_t>(b.batch, 1);
    const int64_t xn = b.x.shape.numel() / n, yn = b.y.shape.numel() / n;
    const bool share = rows_end_ > 0 && b.batch == batch_;  // a smaller last batch is read whole
    for (int64_t k = share ? rows_begin_ : 0; k < (share ? rows_end_ : n); ++k) {
      if (!all_finite(b.x.data.data() + k * xn, xn))
        for (int64_t j = 0; j < xn; ++j) {
          const float v = b.x.data[static_cast<size_t>(k * xn + j)];
          if (!std::isfinite(v))
            fail(k,
                 "has input value " + num(v) + " at feature " + std::to_string(j) + "; inputs must be finite numbers");
        }
      if (!rules_.fields.empty()) {
        check_fields(b, k, yn);
        continue;
      }
      if (rules_.soft && yn % rules_.classes != 0)
        fail(k,
             "has " + std::to_string(yn) + " label value(s), but output '" + rules_.ce_output +
                 "' (softmax_cross_entropy) is trained on " + std::to_string(rules_.classes) +
                 "-wide class probabilities (one-hot): give this pipeline the same labels (e.g. the one_hot map op)");
      // Soft labels: rows of `classes` values (one row per position of a sequence), each summing to 1.
      const int64_t row_w = rules_.soft ? rules_.classes : yn;
      double row_sum = 0;
      for (int64_t j = 0; j < yn; ++j) {
        const float v = b.y.data[static_cast<size_t>(k * yn + j)];
        if (!std::isfinite(v)) fail(k, "has label " + num(v) + "; labels must be finite numbers");
        if (rules_.soft && j % row_w == 0 && j > 0) {
          check_row_sum(k, row_sum, yn);
          row_sum = 0;
        }
        row_sum += v;
        if (rules_.soft && (v < 0 || v > 1))
          fail(k, "has label value " + num(v) + " for class " + std::to_string(j) + ", but output '" +
                      rules_.ce_output + "' (softmax_cross_entropy) takes these " + std::to_string(yn) +
                      "-wide labels as class probabilities: expected values in [0, 1]");
        if (rules_.classes > 0 && !rules_.soft &&
            (v < 0 || v >= static_cast<float>(rules_.classes) || v != std::floor(v)))
          fail(k, "has label " + num(v) + ", but output '" + rules_.ce_output + "' (softmax_cross_entropy) has " +
                      std::to_string(rules_.classes) + " classes: expected an integer class index in [0, " +
                      std::to_string(rules_.classes) + ")");
        if (rules_.unit && (v < 0 || v > 1))
          fail(k, "has label " + num(v) + ", but output '" + rules_.bce_output +
                      "' (binary_cross_entropy) expects targets in [0, 1]");
      }
      if (rules_.soft) check_row_sum(k, row_sum, yn);
    }
    seen_ += n;
  }

  void check_fields(const Element& b, int64_t k, int64_t yn) const {
    if (yn != static_cast<int64_t>(rules_.names))
      fail(k, "has " + std::to_string(yn) + " label value(s), but the data names " + std::to_string(rules_.names) +
                  " labels");
    for (const auto& f : rules_.fields) {
      const float v = b.y.data[static_cast<size_t>(k * yn) + f.col];
      const std::string who = "label \"" + f.label + "\" " + num(v) + ", but output '" + f.output + "'";
      if (!std::isfinite(v)) fail(k, "has label \"" + f.label + "\" " + num(v) + "; labels must be finite numbers");
      if (f.classes > 0 && (v < 0 || v >= static_cast<float>(f.classes) || v != std::floor(v)))
        fail(k, "has " + who + " (softmax_cross_entropy) has " + std::to_string(f.classes) +
                    " classes: expected an integer class index in [0, " + std::to_string(f.classes) + ")");
      if (f.unit && (v < 0 || v > 1)) fail(k, "has " + who + " (binary_cross_entropy) expects targets in [0, 1]");
    }
  }

  void check_row_sum(int64_t k, double row_sum, int64_t yn) const {
    if (std::fabs(row_sum - 1.0) > 1e-3)
      fail(k, "has labels summing to " + num(static_cast<float>(row_sum)) + ", but output '" + rules_.ce_output +
                  "' (softmax_cross_entropy) takes these " + std::to_string(yn) +
                  "-wide labels as class probabilities: expected one-hot or probabilities summing to 1 (for several "
                  "independent labels per example use binary_cross_entropy)");
  }

  static std::string num(float v) {
    std::ostringstream os;
    os << std::setprecision(9) << v;
    return os.str();
  }

  [[noreturn]] void fail(int64_t row, const std::string& what) const {
    std::ostringstream os;
    os << source_ << ": example ";
    if (seen_known_)
      os << seen_ + row << " of epoch " << epoch_ + 1 << " (in the order the pipeline delivers it, after any shuffle)";
    else
      os << "at row " << row << " of a batch after a restored position";
    os << " " << what << ". Fix the data, or the model's output layer and loss.";
    throw DataError(os.str());
  }

  std::unique_ptr<Stage> up_;
  LabelRules rules_;
  std::string source_;
  uint64_t epoch_ = 0;
  int64_t seen_ = 0;
  bool seen_known_ = true;
  int64_t rows_begin_, rows_end_, batch_;  // the rows this process's pipeline fills (rows_end_ = 0: all)
};

}  // namespace

std::unique_ptr<Stage> checked_stage(std::unique_ptr<Stage> up, LabelRules rules, std::string source,
                                     int64_t rows_begin, int64_t rows_end, int64_t batch) {
  return std::make_unique<CheckedStage>(std::move(up), std::move(rules), std::move(source), rows_begin, rows_end,
                                        batch);
}

Evaluation evaluate(Runner& r, Stage& pipeline, const ModelSpec& m, bool use_ema) {
  pipeline.reset(0);
  Evaluation e;
  const size_t heads = m.outputs.size();
  std::vector<double> loss_sum(heads, 0.0);
  std::vector<int64_t> correct(heads, 0), counted(heads, 0);  // per head: right predictions, predictions
  int64_t batches = 0;
  while (auto b = pipeline.next()) {
    EvalResult res = r.eval_batch(*b, use_ema);
    ++batches;
    for (size_t i = 0; i < res.losses.size(); ++i) {
      if (std::isfinite(res.losses[i])) continue;
      // A NaN loss must not end as an accuracy next to "test_loss: null": stop like training does.
      std::string layer = r.find_nonfinite_layer(*b, 0);
      std::ostringstream os;
      os << "evaluation stopped: the loss of output '" << (i < m.outputs.size() ? m.outputs[i].layer : "?") << "' is "
         << res.losses[i] << " on evaluation batch " << batches << " (examples " << e.examples << " to "
         << e.examples + b->batch - 1 << "); "
         << (layer.empty() ? "every layer output is finite, so the loss itself overflowed"
                           : "the first layer whose output is non-finite is '" + layer + "'")
         << ". No accuracy is reported for data that gives a non-finite loss.";
      throw NumericError(os.str());
    }
    for (size_t i = 0; i < res.losses.size() && i < heads; ++i) loss_sum[i] += res.losses[i];
    e.examples += b->batch;
    const int64_t n = std::max<int64_t>(b->batch, 1);
    for (size_t i = 0; i < heads && i < res.outputs.size(); ++i) {
      if (m.outputs[i].loss == LossKind::mse) continue;
      const HostTensor& out = res.outputs[i];
      if (const int64_t col = label_column(m, m.outputs[i]); col >= 0) {  // a named label: one value per example
        const int64_t yw = b->y.shape.numel() / n, cols = out.shape.numel() / n;
        for (int64_t k = 0; k < n; ++k) {
          const float* row = out.data.data() + k * cols;
          const float y = b->y.data[static_cast<size_t>(k * yw + col)];
          if (m.outputs[i].loss == LossKind::softmax_cross_entropy) {
            correct[i] += std::max_element(row, row + cols) - row == static_cast<int64_t>(y);
          } else {
            correct[i] += (row[0] > (m.outputs[i].from_logits ? 0.f : 0.5f)) == (y > 0.5f);
          }
        }
        counted[i] += n;
        continue;
      }
      if (m.outputs[i].loss == LossKind::softmax_cross_entropy) {
        // One prediction per row of the logits' last dim: per example, or per position of a sequence (per token).
        const int64_t cols = out.shape[out.shape.rank() - 1], rows = out.shape.numel() / std::max<int64_t>(cols, 1);
        const int64_t yw = b->y.shape.numel() / std::max<int64_t>(rows, 1);  // 1: class indices; cols: probabilities
        for (int64_t k = 0; k < rows; ++k) {
          const float* row = out.data.data() + k * cols;
          int64_t best = 0;
          for (int64_t c = 1; c < cols; ++c)
            if (row[c] > row[best]) best = c;
          int64_t label = static_cast<int64_t>(b->y.data[static_cast<size_t>(k)]);
          if (yw > 1) {  // one-hot or class probabilities: the most probable class
            const float* t = b->y.data.data() + k * yw;
            label = 0;
            for (int64_t c = 1; c < yw; ++c)
              if (t[c] > t[label]) label = c;
          }
          correct[i] += best == label;
        }
        counted[i] += rows;
      } else {  // binary: each column thresholded, an example right when all are
        const int64_t cols = out.shape.numel() / n;
        const float thr = m.outputs[i].from_logits ? 0.f : 0.5f;
        for (int64_t k = 0; k < n; ++k) {
          const float* row = out.data.data() + k * cols;
          bool ok = true;
          for (int64_t c = 0; c < cols; ++c)
            ok = ok && ((row[c] > thr) == (b->y.data[static_cast<size_t>(k * cols + c)] > 0.5f));
          correct[i] += ok;
        }
        counted[i] += n;
      }
    }
  }
  if (e.examples > 0) {
    for (size_t i = 0; i < heads; ++i) {
      e.losses.push_back(loss_sum[i] / static_cast<double>(e.examples));
      e.loss += e.losses.back();
      e.accuracies.push_back(counted[i] > 0 ? static_cast<double>(correct[i]) / static_cast<double>(counted[i]) : -1);
      if (e.accuracy < 0 && counted[i] > 0) e.accuracy = e.accuracies.back();
    }
  }
  return e;
}

}  // namespace kiln
