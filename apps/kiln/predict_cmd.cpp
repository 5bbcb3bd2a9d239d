// kiln predict CONFIG [--checkpoint F] [--data NAME | --input X.npy] --output preds.csv|preds.npy: one row per
// example, the heads' outputs as used: softmax probabilities (softmax_cross_entropy), sigmoid probabilities (binary
// cross-entropy from logits), raw outputs otherwise.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "kiln/error.hpp"
#include "model_io.hpp"

namespace kiln::app {

namespace {

// Batches of a .npy array of model inputs (N, input_shape...) or (N, numel), with placeholder labels (0) that the
// graph needs and nothing reads.
class NpyBatches : public Stage {
 public:
  NpyBatches(HostTensor x, Shape example, Shape label, int64_t batch)
      : x_(std::move(x)), example_(std::move(example)), label_(std::move(label)), batch_(batch) {}
  std::string name() const override { return "npy"; }
  std::optional<Element> next() override {
    const int64_t n = x_.shape[0], per = example_.numel();
    if (pos_ >= n) return std::nullopt;
    const int64_t b = std::min(batch_, n - pos_);
    Element e;
    e.batch = b;
    e.x = HostTensor(example_.with_batch(b));
    std::copy(x_.data.begin() + pos_ * per, x_.data.begin() + (pos_ + b) * per, e.x.data.begin());
    e.y = HostTensor(label_.with_batch(b));
    pos_ += b;
    return e;
  }
  void reset(uint64_t) override { pos_ = 0; }
  Shape example_shape() const override { return example_; }
  Shape label_shape() const override { return label_; }
  int64_t size_hint() const override { return x_.shape[0]; }
  StageState save() const override { return {}; }
  void restore(const StageState&) override {}

 private:
  HostTensor x_;
  Shape example_, label_;
  int64_t batch_, pos_ = 0;
};

}  // namespace

int cmd_predict(const Options& o) {
  const bool npy = o.output.size() > 4 && o.output.compare(o.output.size() - 4, 4, ".npy") == 0;
  const bool csv = o.output.size() > 4 && o.output.compare(o.output.size() - 4, 4, ".csv") == 0;
  if (!npy && !csv) throw ConfigError("--output " + o.output + ": expected a file name ending in .csv or .npy");
  check_new_output(o.output, o.overwrite, "--output");
  auto m = load_trained_model(o);
  Session& s = *m->session;
  const ModelSpec& model = s.model();

  std::unique_ptr<Stage> data;
  std::string from;
  std::unique_ptr<Stage> train = s.make_pipeline("train");
  std::unique_ptr<Stage> test = s.make_pipeline(o.data);
  Shape label = train ? train->label_shape() : test ? test->label_shape() : Shape{};
  if (!o.input.empty()) {
    HostTensor x = read_npy(o.input);
    const int64_t per = model.input_shape.numel();
    if (x.shape.rank() < 1 || x.shape[0] < 1 || x.shape.numel() != x.shape[0] * per)
      throw DataError(o.input + ": --input holds an array of shape " + x.shape.str() + "; the model takes (N, " +
                      model.input_shape.str().substr(1) + " (or (N, " + std::to_string(per) + ")), N >= 1");
    data = std::make_unique<NpyBatches>(std::move(x), model.input_shape, label, s.train().batch_size);
    from = o.input;
  } else {
    if (!test)
      throw ConfigError(o.config + ": has no [data." + o.data +
                        "] pipeline to predict on (--data), and no --input was given");
    data = std::move(test);
    from = describe_source(s.config(), o.data);
  }
  auto runner = make_inference_runner(*m, label);

  // Columns: every head's outputs per example, heads in [model] order.
  std::vector<std::string> names;
  std::vector<float> rows;
  int64_t n = 0, width = 0;
  data->reset(0);
  while (auto b = data->next()) {
    EvalResult r = runner->eval_batch(*b, false);
    std::vector<std::vector<float>> cols(static_cast<size_t>(b->batch));
    for (size_t h = 0; h < model.outputs.size(); ++h) {
      const OutputSpec& head = model.outputs[h];
      const HostTensor& out = r.outputs[h];
      const int64_t k = out.shape.numel() / b->batch;
      // A sequence head (N, T, classes) gives each position its own distribution over the last axis.
      const bool softmax = head.loss == LossKind::softmax_cross_entropy;
      const int64_t cls = softmax && out.shape.rank() > 2 ? out.shape[out.shape.rank() - 1] : k;
      if (n == 0)
        for (int64_t j = 0; j < k; ++j)
          names.push_back((model.outputs.size() > 1 ? head.layer + "." : std::string()) +
                          (cls < k ? "p" + std::to_string(j / cls) + "." : std::string()) +
                          (softmax ? "class_" : "out_") + std::to_string(j % cls));
      for (int64_t i = 0; i < b->batch; ++i) {
        const float* zi = out.data.data() + i * k;
        auto& row = cols[static_cast<size_t>(i)];
        if (softmax) {  // max-subtracted, as the op computes it
          for (int64_t at = 0; at < k; at += cls) {
            const float* z = zi + at;
            float mx = z[0];
            for (int64_t j = 1; j < cls; ++j) mx = std::max(mx, z[j]);
            double sum = 0;
            std::vector<double> e(static_cast<size_t>(cls));
            for (int64_t j = 0; j < cls; ++j)
              sum += e[static_cast<size_t>(j)] = std::exp(static_cast<double>(z[j] - mx));
            for (int64_t j = 0; j < cls; ++j) row.push_back(static_cast<float>(e[static_cast<size_t>(j)] / sum));
          }
        } else if (head.loss == LossKind::binary_cross_entropy && head.from_logits) {
          for (int64_t j = 0; j < k; ++j)
            row.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(zi[j])))));
        } else {
          row.insert(row.end(), zi, zi + k);
        }
      }
    }
    for (auto& row : cols) rows.insert(rows.end(), row.begin(), row.end());
    n += b->batch;
  }
  width = static_cast<int64_t>(names.size());
  if (n == 0) throw DataError(from + ": delivered no examples to predict on");

  if (npy) {
    write_npy(o.output, rows, {n, width});
  } else {
    std::string text;
    for (size_t j = 0; j < names.size(); ++j) {
      if (j) text += ',';
      text += names[j];
    }
    text += "\n";
    char num[32];
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < width; ++j) {
        std::snprintf(num, sizeof num, "%.9g",
                      static_cast<double>(rows[static_cast<size_t>(i * width + j)]));  // exact float
        text += (j ? "," : "");
        text += num;
      }
      text += "\n";
    }
    write_file_atomic(o.output, text);
  }
  std::cout << "predicted " << n << " examples of " << from << " with " << m->checkpoint_path << " (epoch "
            << m->checkpoint.epoch << ", step " << m->checkpoint.step << ", " << (m->ema ? "ema" : "raw")
            << " weights): " << width << " columns written to " << o.output << "\n";
  return 0;
}

}  // namespace kiln::app
