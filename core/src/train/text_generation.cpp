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
#include "kiln/session.hpp"
#include "kiln/single_runner.hpp"

namespace kiln {

namespace {

std::string utf8(uint32_t cp) {
  std::string o;
  if (cp < 0x80) {
    o += static_cast<char>(cp);
  } else if (cp < 0x800) {
    o += static_cast<char>(0xc0 | (cp >> 6));
    o += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    o += static_cast<char>(0xe0 | (cp >> 12));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    o += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    o += static_cast<char>(0xf0 | (cp >> 18));
    o += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    o += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return o;
}

// The UTF-8 characters of `s` (an invalid byte stands for itself).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
    if (i + len > s.size()) len = 1;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// A reader for the small JSON object the text source writes: {"kind": "...", "tokens": [...]} or "size": 256.
class JsonReader {
 public:
  JsonReader(const std::string& s, std::string where) : s_(s), where_(std::move(where)) {}
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool peek(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string str() {
    expect('"');
    std::string o;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        o += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unfinished escape");
      c = s_[i_++];
      switch (c) {
        case 'n':
          o += '\n';
          break;
        case 't':
          o += '\t';
          break;
        case 'r':
          o += '\r';
          break;
        case 'b':
          o += '\b';
          break;
        case 'f':
          o += '\f';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("short \\u escape");
          uint32_t cp = static_cast<uint32_t>(std::stoul(s_.substr(i_, 4), nullptr, 16));
          i_ += 4;
          if (cp >= 0xd800 && cp < 0xdc00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            const auto lo = static_cast<uint32_t>(std::stoul(s_.substr(i_ + 2, 4), nullptr, 16));
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            i_ += 6;
          }
          o += utf8(cp);
          break;
        }
        default:
          o += c;
      }
    }
    expect('"');
    return o;
  }
  int64_t integer() {
    ws();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s_.substr(i_), &used);
    } catch (const std::exception&) {
      fail("expected an integer");
    }
    i_ += used;
    return v;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(where_ + ": not a Kiln vocabulary (" + what + " at byte " + std::to_string(i_) +
                    "); it is written by the text source when a run starts");
  }

 private:
  const std::string& s_;
  std::string where_;
  size_t i_ = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

Vocabulary parse_vocabulary(const std::string& json, const std::string& where) {
  Vocabulary v;
  JsonReader r(json, where);
  std::string kind;
  bool sized = false, listed = false;
  r.expect('{');
  while (!r.peek('}')) {
    const std::string key = r.str();
    r.expect(':');
    if (key == "kind") {
      kind = r.str();
    } else if (key == "size") {
      if (r.integer() != 256) r.fail("a byte vocabulary has 256 ids");
      sized = true;
    } else if (key == "tokens") {
      r.expect('[');
      while (!r.peek(']')) {
        v.tokens.push_back(r.str());
        if (!r.peek(']')) r.expect(',');
      }
      r.expect(']');
      listed = true;
    } else {
      r.fail("unknown key \"" + key + "\"");
    }
    if (!r.peek('}')) r.expect(',');
  }
  if (kind == "bytes" && sized) {
    v.bytes = true;
  } else if (kind != "chars" || !listed || v.tokens.empty()) {
    r.fail("expected {\"kind\": \"chars\", \"tokens\": [...]} or {\"kind\": \"bytes\", \"size\": 256}");
  }
  return v;
}

std::vector<int64_t> Vocabulary::encode(const std::string& text, const std::string& what) const {
  std::vector<int64_t> ids;
  if (bytes) {
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < tokens.size(); ++i) index.emplace(tokens[i], static_cast<int64_t>(i));
  const auto chars = characters(text);
  for (size_t p = 0; p < chars.size(); ++p) {
    auto it = index.find(chars[p]);
    if (it == index.end()) {
      std::string shown = chars[p] == "\n" ? "\\n" : chars[p] == "\t" ? "\\t" : chars[p];
      throw ConfigError(what + ": character '" + shown + "' at position " + std::to_string(p) +
                        " is not in the model's vocabulary of " + std::to_string(tokens.size()) +
                        " characters (the distinct characters of its training text)");
    }
    ids.push_back(it->second);
  }
  return ids;
}

std::string Vocabulary::decode(int64_t id) const {
  if (bytes) return std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
  return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(id)] : std::string("?");
}

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
    if (t.role != TensorRole::parameter && t.role != TensorRole::ema) continue;
    auto it = c.tensors.find(t.name);
    if (it == c.tensors.end())
      throw DataError(ckpt + ": has no tensor '" + t.name + "'; was it written by another model than " +
                      s.config().file() + "?");
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
