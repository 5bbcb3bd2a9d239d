// kiln predict CONFIG [--checkpoint F] [--data NAME | --input X.npy] --output preds.csv|preds.npy: one row per
// example, the heads' outputs as used: softmax probabilities (softmax_cross_entropy), sigmoid probabilities (binary
// cross-entropy from logits), raw outputs otherwise.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "kiln/data_fit.hpp"
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

std::string dims_text(const std::vector<int64_t>& d) {
  std::string t;
  for (auto v : d) t += (t.empty() ? "" : ", ") + std::to_string(v);
  return t;
}

// Where value `j` of an example of shape `in` sits, for messages: "x[3, 0, 5, 7]" for example 3.
std::string element(int64_t example, int64_t j, const Shape& in) {
  std::vector<int64_t> at(in.rank());
  for (size_t k = in.rank(); k-- > 0;) {
    at[k] = j % in[k];
    j /= in[k];
  }
  at.insert(at.begin(), example);
  return "x[" + dims_text(at) + "]";
}

// How to reorder an array whose examples hold the model's dims in another order ((N, 28, 28, 1) for (N, 1, 28, 28):
// ", 3, 1, 2"), or "" when they are not a permutation of them.
std::string transpose_to(const Shape& found, const Shape& in) {
  if (found.rank() != in.rank() + 1) return {};
  std::vector<bool> used(found.rank(), false);
  std::string perm = "0";
  for (size_t k = 0; k < in.rank(); ++k) {
    size_t f = 1;
    while (f < found.rank() && (used[f] || found[f] != in[k])) ++f;
    if (f == found.rank()) return {};
    used[f] = true;
    perm += ", " + std::to_string(f);
  }
  return perm;
}

// --input as the model takes it: (N, input_shape...), or (input_shape...) for one example. The same number of values
// in another shape (channels last, flattened) is refused, since its values would be read in another order; so are
// values no model input can be: non-finite ones, and ids outside [0, vocab) where the input feeds an embedding.
HostTensor model_inputs(HostTensor x, const ModelSpec& model, const std::string& file, const std::string& config) {
  const Shape& in = model.input_shape;
  const std::vector<int64_t>& d = x.shape.dims();
  const bool many = d.size() == in.rank() + 1 && std::equal(in.dims().begin(), in.dims().end(), d.begin() + 1);
  if (d == in.dims()) {
    x.shape = in.with_batch(1);
  } else if (!many || d[0] < 1) {
    std::string msg = file + ": --input holds an array of shape " + x.shape.str() + ", but the model of " + config +
                      " ([model] input_shape = [" + dims_text(in.dims()) + "]) takes (N, " + dims_text(in.dims()) +
                      "), N >= 1 examples, or one example of shape " + in.str();
    if (many)
      msg += ": the array holds no examples";
    else if (auto perm = transpose_to(x.shape, in); !perm.empty())
      msg +=
          ": its examples hold the same dims in another order (channels last?); reorder them, e.g. numpy's "
          "x.transpose(" +
          perm + ")";
    else if (d.size() > 0 && x.shape.numel() % std::max<int64_t>(in.numel(), 1) == 0)
      msg +=
          ": an array of the same number of values in another shape is refused, since its values would be read "
          "in another order; reshape it (numpy's x.reshape(-1, " +
          dims_text(in.dims()) + ")) only if each example's values are in that order";
    throw DataError(msg);
  }
  const int64_t n = x.shape[0], per = in.numel();
  const std::vector<InputEmbedding> emb = input_embeddings(model);
  const InputEmbedding* ids = nullptr;
  for (const auto& e : emb)
    if (!ids || e.vocab < ids->vocab) ids = &e;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < per; ++j) {
      const float v = x.data[static_cast<size_t>(i * per + j)];
      if (!std::isfinite(v))
        throw DataError(file + ": example " + std::to_string(i) + " of --input has " + element(i, j, in) + " = " +
                        std::to_string(v) + "; the model's inputs must be finite numbers");
      if (ids && (v < 0 || v >= static_cast<float>(ids->vocab) || v != std::floor(v))) {
        char num[32];
        std::snprintf(num, sizeof num, "%.9g", static_cast<double>(v));
        throw DataError(file + ": example " + std::to_string(i) + " of --input has " + element(i, j, in) + " = " + num +
                        ", but the model's input feeds layer " + std::to_string(ids->index) + " '" + ids->layer +
                        "' (type = \"embedding\", vocab = " + std::to_string(ids->vocab) +
                        ") and must hold token ids, integers in [0, " + std::to_string(ids->vocab) + ")");
      }
    }
  return x;
}

}  // namespace

int cmd_predict(const Options& o) {
  const bool npy = o.output.size() > 4 && o.output.compare(o.output.size() - 4, 4, ".npy") == 0;
  const bool csv = o.output.size() > 4 && o.output.compare(o.output.size() - 4, 4, ".csv") == 0;
  if (!npy && !csv) throw ConfigError("--output " + o.output + ": expected a file name ending in .csv or .npy");
  check_new_output(o, "--output");
  auto m = load_trained_model(o);
  Session& s = *m->session;
  const ModelSpec& model = s.model();

  std::unique_ptr<Stage> data;
  std::string from;
  std::unique_ptr<Stage> train = s.make_pipeline("train");
  std::unique_ptr<Stage> test = s.make_pipeline(o.data);
  Shape label = train ? train->label_shape() : test ? test->label_shape() : Shape{};
  if (!o.input.empty()) {
    HostTensor x = model_inputs(read_npy(o.input), model, o.input, o.config);
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
    for (size_t h = 0; h < model.outputs.size(); ++h)
      append_prediction_columns(model, h, r.outputs[h], b->batch, cols, n == 0 ? &names : nullptr);
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
