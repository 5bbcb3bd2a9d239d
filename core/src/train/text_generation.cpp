// kiln sample: autoregressive generation from a trained text model (nanoGPT's sample.py and model.generate).
#include "kiln/text_generation.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <random>
#include <sstream>

#include "kiln/checkpoint.hpp"
#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/session.hpp"
#include "kiln/single_runner.hpp"

namespace kiln {

namespace {

std::string read_file(const std::string& path) {
  require_regular_file(path, "the run's vocabulary (vocab.json, written by kiln train)");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

void sample_text(Session& s, const SampleOptions& o, std::ostream& out) {
  namespace fs = std::filesystem;
  const std::string dir = s.train().output_dir;
  // The vocabulary the run saved, else the one its [data.train] text source builds now.
  const std::string vpath = dir + "/vocab.json";
  std::error_code ec;
  Vocabulary vocab;
  if (fs::exists(vpath, ec)) {
    vocab = parse_vocabulary(read_file(vpath), vpath);
  } else if (!s.vocabulary().empty()) {
    vocab = parse_vocabulary(s.vocabulary(), s.config().file() + ": [data.train] text source");
  } else {
    throw ConfigError(s.config().file() + ": kiln sample needs a model trained on text: " + vpath +
                      " does not exist and [data.train] is not a text source (a tokens source has ids but no "
                      "vocabulary to decode them)");
  }
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw ConfigError("--temperature: expected a positive number, e.g. 0.8 (lower is more conservative), found " +
                      std::to_string(o.temperature));
  if (o.tokens < 0)
    throw ConfigError("--tokens: expected a number of tokens to generate, found " + std::to_string(o.tokens));
  if (o.top_k < 0)
    throw ConfigError("--top-k: expected 0 (every token) or a positive count, found " + std::to_string(o.top_k));
  if (o.prompt.empty())
    throw ConfigError("--prompt: empty; give at least one character to start from (nanoGPT's default is \"\\n\")");
  std::vector<int64_t> ids = vocab.encode(o.prompt, "--prompt");

  // The model reads (T) token ids and writes (T, V) logits per example.
  ModelSpec& m = s.model();
  if (m.input_shape.rank() != 1)
    throw ConfigError(s.config().file() + ": [model] input_shape is " + m.input_shape.str() +
                      "; kiln sample needs a text model reading [block_size] token ids");
  const int64_t T = m.input_shape[0];
  m.label_shape = Shape{T};
  const std::string ckpt = o.checkpoint.empty() ? dir + "/checkpoint.kiln" : o.checkpoint;
  if (!fs::exists(ckpt, ec))
    throw ConfigError((o.checkpoint.empty() ? "the run's checkpoint " : "--checkpoint ") + ckpt +
                      " does not exist; train first (kiln train " + s.config().file() + ") or pass --checkpoint FILE");
  Checkpoint c = load_checkpoint(ckpt);

  s.open_devices(/*reserve=*/false);
  RunnerContext ctx = s.runner_context();
  ctx.global_batch = 1;
  SingleDeviceRunner runner(ctx, 0);
  const bool ema = s.optimizer().ema_decay > 0;
  Executor& ex = runner.executor(1, false, ema);
  const Graph& g = ex.graph();
  if (g.outputs.empty()) throw ConfigError(s.config().file() + ": the model has no output");
  const Shape ys = g.tensor(g.outputs[0]).shape;
  if (ys.rank() != 3 || ys[1] != T)
    throw ConfigError(s.config().file() + ": the model's output '" + g.output_names[0] + "' is " + ys.str() +
                      " for one example; kiln sample needs per-position logits (1, " + std::to_string(T) +
                      ", vocab) from a text model");
  const int64_t V = ys[2];
  if (V < vocab.size())
    throw ConfigError(s.config().file() + ": the model's output '" + g.output_names[0] + "' has " + std::to_string(V) +
                      " logits per position, fewer than the " + std::to_string(vocab.size()) +
                      " ids of the vocabulary it is sampled with");
  for (const auto& t : g.tensors()) {
    // Buffers too: a frozen layer's weights (trainable = false) are buffers, and a checkpoint holds them.
    const bool buffer = t.role == TensorRole::buffer && t.alias_of == kNoTensor;
    if (t.role != TensorRole::parameter && t.role != TensorRole::ema && !buffer) continue;
    auto it = c.tensors.find(t.name);
    if (it == c.tensors.end())
      throw DataError(ckpt + ": has no tensor '" + t.name + "'; was it written by another model than " +
                      s.config().file() + "?");
    if (it->second.shape != t.shape)
      throw DataError(ckpt + ": tensor '" + t.name + "' is " + it->second.shape.str() + " there, but the model of " +
                      s.config().file() + " has " + t.shape.str() +
                      ": the checkpoint was written by another model (or the config changed since)");
    runner.state().write(t.name, it->second);
  }

  std::mt19937_64 rng(o.seed);
  Element e;
  e.batch = 1;
  e.x = HostTensor(Shape{1, T});
  e.y = HostTensor(Shape{1, T});
  std::vector<double> p(static_cast<size_t>(V));
  out << o.prompt << std::flush;
  for (int64_t step = 0; step < o.tokens; ++step) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(ids.size()), T);  // crop to the last T tokens
    const int64_t from = static_cast<int64_t>(ids.size()) - len;
    std::fill(e.x.data.begin(), e.x.data.end(), 0.f);
    for (int64_t j = 0; j < len; ++j)
      e.x.data[static_cast<size_t>(j)] = static_cast<float>(ids[static_cast<size_t>(from + j)]);
    EvalResult r = runner.eval_batch(e, ema);
    const float* logits = r.outputs[0].data.data() + (len - 1) * V;
    // logits / temperature; below the k-th largest -> -inf (ids past the vocabulary never); softmax; one draw.
    std::vector<double> z(static_cast<size_t>(vocab.size()));
    for (int64_t v = 0; v < vocab.size(); ++v) z[static_cast<size_t>(v)] = double(logits[v]) / o.temperature;
    if (o.top_k > 0 && o.top_k < vocab.size()) {
      std::vector<double> sorted = z;
      std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
      const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
      for (auto& v : z)
        if (v < kth) v = -std::numeric_limits<double>::infinity();
    }
    const double mx = *std::max_element(z.begin(), z.end());
    if (!std::isfinite(mx))
      throw NumericError("kiln sample: the model's logits are not finite at step " + std::to_string(step) +
                         "; the checkpoint " + ckpt + " holds non-finite weights");
    double total = 0;
    for (size_t v = 0; v < z.size(); ++v) total += (p[v] = std::exp(z[v] - mx));
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
    int64_t next = -1;
    double acc = 0;
    for (size_t v = 0; v < z.size(); ++v) {
      if (p[v] <= 0) continue;
      acc += p[v];
      next = static_cast<int64_t>(v);  // the last possible token, should rounding leave u above the sum
      if (u < acc) break;
    }
    ids.push_back(next);
    out << vocab.decode(next) << std::flush;
  }
  out << "\n";
}

}  // namespace kiln
