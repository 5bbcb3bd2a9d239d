// [init] from: the model's parameters and buffers from a safetensors file or a Kiln checkpoint, matched by name
// through [init] map, a preset and the names themselves, checked whole (names, shapes, bytes, finiteness) before a
// value is copied. docs/weights.md.
#include "kiln/init_from.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "kiln/checkpoint.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/files.hpp"
#include "kiln/model.hpp"
#include "kiln/safetensors.hpp"

namespace kiln {

namespace {

// A name pattern: literal text and {placeholders}, each matching one or more digits (a block's index).
struct Pattern {
  std::vector<std::pair<bool, std::string>> parts;  // (is placeholder, text or placeholder name)
  bool plain() const { return parts.size() <= 1 && (parts.empty() || !parts[0].first); }
};

// Splits "h{i}_attn.qkv_kernel"; `fail` reports a malformed placeholder.
template <class Fail>
Pattern compile(const std::string& s, Fail fail) {
  Pattern p;
  std::string lit;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '}') fail("a '}' without its '{'");
    if (s[i] != '{') {
      lit += s[i];
      continue;
    }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) fail("a '{' without its '}'");
    const std::string name = s.substr(i + 1, close - i - 1);
    const bool ident = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(),
                                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!ident) fail("placeholder '{" + name + "}' is not a name such as {i}");
    if (!p.parts.empty() && p.parts.back().first && lit.empty()) fail("two placeholders with nothing between them");
    if (!lit.empty()) p.parts.emplace_back(false, std::move(lit)), lit.clear();
    p.parts.emplace_back(true, name);
    i = close;
  }
  if (!lit.empty()) p.parts.emplace_back(false, std::move(lit));
  return p;
}

using Bindings = std::map<std::string, std::string>;

bool match_from(const Pattern& p, size_t k, const std::string& s, size_t pos, Bindings& b) {
  if (k == p.parts.size()) return pos == s.size();
  const auto& [ph, text] = p.parts[k];
  if (!ph) return s.compare(pos, text.size(), text) == 0 && match_from(p, k + 1, s, pos + text.size(), b);
  size_t end = pos;
  while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  for (size_t e = end; e > pos; --e) {  // longest first; the same name twice must take the same digits
    const std::string v = s.substr(pos, e - pos);
    auto it = b.find(text);
    if (it != b.end() && it->second != v) continue;
    Bindings nb = b;
    nb[text] = v;
    if (match_from(p, k + 1, s, e, nb)) return b = std::move(nb), true;
  }
  return false;
}

bool match(const Pattern& p, const std::string& s, Bindings& b) {
  b.clear();
  return match_from(p, 0, s, 0, b);
}

std::string substitute(const Pattern& p, const Bindings& b) {
  std::string out;
  for (const auto& [ph, text] : p.parts) out += ph ? b.at(text) : text;
  return out;
}

std::set<std::string> placeholders(const Pattern& p) {
  std::set<std::string> out;
  for (const auto& [ph, text] : p.parts)
    if (ph) out.insert(text);
  return out;
}

// Hugging Face's GPT2LMHeadModel (Conv1D weights are (in, out), as Kiln's kernels: no transposes) onto Kiln's GPT
// layer names (samples/gpt2_small.toml, samples/shakespeare_char.toml): file names without the "transformer."
// prefix, which load_initial_weights adds when the file has it.
std::vector<InitRule> gpt2_rules() {
  const char* const pairs[][2] = {
      {"wte.table", "wte.weight"},
      {"h{i}_ln_1.gamma", "h.{i}.ln_1.weight"},
      {"h{i}_ln_1.beta", "h.{i}.ln_1.bias"},
      {"h{i}_attn.qkv_kernel", "h.{i}.attn.c_attn.weight"},
      {"h{i}_attn.qkv_bias", "h.{i}.attn.c_attn.bias"},
      {"h{i}_attn.proj_kernel", "h.{i}.attn.c_proj.weight"},
      {"h{i}_attn.proj_bias", "h.{i}.attn.c_proj.bias"},
      {"h{i}_ln_2.gamma", "h.{i}.ln_2.weight"},
      {"h{i}_ln_2.beta", "h.{i}.ln_2.bias"},
      {"h{i}_fc.kernel", "h.{i}.mlp.c_fc.weight"},
      {"h{i}_fc.bias", "h.{i}.mlp.c_fc.bias"},
      {"h{i}_proj.kernel", "h.{i}.mlp.c_proj.weight"},
      {"h{i}_proj.bias", "h.{i}.mlp.c_proj.bias"},
      {"ln_f.gamma", "ln_f.weight"},
      {"ln_f.beta", "ln_f.bias"},
  };
  std::vector<InitRule> r;
  for (const auto& p : pairs) r.push_back(InitRule{p[0], p[1], false, false, "preset gpt2"});
  // wpe is (n_positions, C) in the file; Kiln's table is as long as the model's context.
  r.push_back(InitRule{"wpe.table", "wpe.weight", false, true, "preset gpt2"});
  // An untied output layer (dense without tie) takes lm_head.weight, nn.Linear's (vocab, C), transposed.
  r.push_back(InitRule{"lm_head.kernel", "lm_head.weight", true, false, "preset gpt2"});
  return r;
}

std::string list_text(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : "; ") + n;
  return s;
}

std::string thousands(uint64_t v) {
  std::string d = std::to_string(v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

bool is_checkpoint(const std::string& path) {
  char magic[8] = {};
  std::ifstream f(path, std::ios::binary);
  return f.read(magic, 8) && (std::memcmp(magic, "KILNCKP2", 8) == 0 || std::memcmp(magic, "KILNCKP1", 8) == 0);
}

// A source's tensors by name: a safetensors file (mapped) or a Kiln checkpoint (read whole, checksum checked).
class Source {
 public:
  explicit Source(const std::string& path) {
    require_regular_file(path, "a safetensors file or a Kiln checkpoint ([init] from)");
    if (is_checkpoint(path)) {
      ckpt_ = std::make_unique<Checkpoint>(load_checkpoint(path));
      for (const auto& [name, t] : ckpt_->tensors) shapes_.emplace(name, t.shape);
    } else {
      st_ = std::make_unique<SafetensorsFile>(path);
      for (const auto& t : st_->tensors()) shapes_.emplace(t.name, t.shape), dtypes_.insert(t.dtype);
    }
  }
  bool checkpoint() const { return ckpt_ != nullptr; }
  const std::map<std::string, Shape>& shapes() const { return shapes_; }
  std::string dtypes() const {
    std::string s;
    for (const auto& d : dtypes_) s += (s.empty() ? "" : ", ") + d;
    return ckpt_ ? "a Kiln checkpoint, float32" : s;
  }
  bool same_values(const std::string& a, const std::string& b) const {
    if (ckpt_) return ckpt_->tensors.at(a).data == ckpt_->tensors.at(b).data;
    const HostTensor x = st_->read(*st_->find(a)), y = st_->read(*st_->find(b));
    return x.shape == y.shape && x.data == y.data;
  }
  HostTensor read(const std::string& path, const std::string& name, bool transpose, int64_t rows) const {
    if (st_) return st_->read(*st_->find(name), transpose, rows);
    const HostTensor& t = ckpt_->tensors.at(name);
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw DataError(path + ": checkpoint tensor '" + name + "' " + t.shape.str() + " holds " +
                        (std::isnan(t.data[i]) ? "NaN" : "an infinity") + " at element " + std::to_string(i) +
                        ": the weights to start from must be finite numbers");
    Shape s = t.shape;
    if (rows >= 0) s[0] = rows;
    HostTensor out(transpose ? Shape{s[1], s[0]} : s);
    if (!transpose) {
      std::copy(t.data.begin(), t.data.begin() + static_cast<std::ptrdiff_t>(out.data.size()), out.data.begin());
      return out;
    }
    for (int64_t r = 0; r < s[0]; ++r)
      for (int64_t c = 0; c < s[1]; ++c)
        out.data[static_cast<size_t>(c * s[0] + r)] = t.data[static_cast<size_t>(r * s[1] + c)];
    return out;
  }

 private:
  std::unique_ptr<SafetensorsFile> st_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::map<std::string, Shape> shapes_;
  std::set<std::string> dtypes_;
};

struct CompiledRule {
  InitRule rule;
  Pattern kiln, file;
};

// Where one model tensor comes from.
struct Plan {
  std::string target, file;
  Shape shape;  // the model's
  bool transpose = false, first_rows = false;
  std::string why;  // the rule, for messages
};

}  // namespace

std::vector<InitRule> init_preset_rules(const std::string& preset) {
  if (preset == "gpt2") return gpt2_rules();
  return {};
}

InitSpec parse_init(const ConfigNode& c, const std::string& base_dir) {
  InitSpec s;
  s.from_as_set = c.get_string("from");
  s.where = c.where("from");
  if (s.from_as_set.empty()) c.fail("from", "expected the path of a safetensors file or a Kiln checkpoint");
  std::filesystem::path f(s.from_as_set);
  s.from = f.is_relative() && !base_dir.empty() ? (std::filesystem::path(base_dir) / f).string() : s.from_as_set;
  s.preset = c.get_choice("preset", {"none", "gpt2"}, "none");
  if (s.preset == "none") s.preset.clear();
  s.strict = c.get_bool("strict", true);
  s.ema = c.get_choice("weights", {"raw", "ema"}, "raw") == "ema";
  s.transpose = c.get_string_list("transpose", {});
  s.ignore = c.get_string_list("ignore", {});
  for (const auto& t : s.transpose)
    compile(t, [&](const std::string& why) { c.fail("transpose", "'" + t + "': " + why); });
  for (const auto& t : s.ignore) compile(t, [&](const std::string& why) { c.fail("ignore", "'" + t + "': " + why); });
  if (auto m = c.table("map")) {
    for (const std::string& key : m->keys()) {
      InitRule r;
      r.kiln = key;
      r.where = m->where(key);
      if (m->is_table(key)) {
        auto e = m->table(key);
        r.file = e->get_string("tensor");
        r.transpose = e->get_bool("transpose", false);
        r.first_rows = e->get_bool("first_rows", false);
        e->finish();
      } else {
        r.file = m->get_string(key);
      }
      auto bad = [&](const std::string& why) { m->fail(key, why); };
      const Pattern kp = compile(key, bad), fp = compile(r.file, bad);
      for (const auto& name : placeholders(fp))
        if (!placeholders(kp).count(name))
          bad("the file's name '" + r.file + "' uses {" + name + "}, which the model's name '" + key +
              "' does not have");
      s.map.push_back(std::move(r));
    }
    m->finish();
  }
  c.finish();
  return s;
}

namespace {

// The model's persistent tensors, as the training graph names them (no storage is allocated by building it).
struct ModelTensors {
  std::vector<std::pair<std::string, Shape>> targets;  // parameters and buffers, model order
  std::set<std::string> params, shadows;               // parameters; their EMA shadows
};

ModelTensors model_tensors(const ModelSpec& m, const OptimizerSpec& opt) {
  GraphOptions go;
  go.batch = 2;  // a training batch norm over features needs two rows
  go.training = true;
  go.optimizer = &opt;
  const Graph g = build_graph(m, go);
  ModelTensors out;
  for (const auto& t : g.tensors()) {
    if (t.alias_of != kNoTensor) continue;
    if (t.role == TensorRole::parameter || t.role == TensorRole::buffer) out.targets.emplace_back(t.name, t.shape);
    if (t.role == TensorRole::parameter) out.params.insert(t.name);
    if (t.role == TensorRole::ema) out.shadows.insert(t.name);
  }
  return out;
}

// The rules that name each model tensor's file tensor: the config's map (exact names before patterns), the preset,
// then the name itself; and the transpose and ignore patterns.
struct NameRules {
  std::vector<CompiledRule> rules;
  std::vector<Pattern> transposed, ignored;
  std::string prefix;  // a preset's prefix of the file's names ("transformer." in save_pretrained's GPT-2 files)
};

NameRules name_rules(const InitSpec& spec, const std::map<std::string, Shape>& have) {
  // Patterns were checked when [init] was read; one built in code is refused here the same way.
  auto refuse = [&](const std::string& why) -> void { throw ConfigError(spec.where + ": a name pattern: " + why); };
  NameRules out;
  std::vector<CompiledRule>& rules = out.rules;
  std::string& prefix = out.prefix;
  // Rules in order: the config's map (exact names before patterns), the preset, then the name itself.
  auto add = [&](const InitRule& r) {
    auto bad = [&](const std::string& why) { throw ConfigError(r.where + ": " + why); };
    rules.push_back(CompiledRule{r, compile(r.kiln, bad), compile(r.file, bad)});
  };
  for (const auto& r : spec.map)
    if (compile(r.kiln, refuse).plain()) add(r);
  for (const auto& r : spec.map)
    if (!compile(r.kiln, refuse).plain()) add(r);
  std::vector<std::string> ignore = spec.ignore;
  if (spec.preset == "gpt2") {
    // GPT2LMHeadModel.save_pretrained writes "transformer.h.0...", the original GPT-2 files "h.0...".
    if (have.count("transformer.wte.weight")) prefix = "transformer.";
    for (InitRule r : gpt2_rules()) {
      if (r.kiln == "lm_head.kernel" && !have.count("lm_head.weight")) r.file = "wte.weight";  // saved tied
      if (r.file != "lm_head.weight") r.file = prefix + r.file;
      add(r);
    }
    // The causal-mask buffers older transformers saved: Kiln's attention makes its own mask.
    ignore.push_back(prefix + "h.{i}.attn.bias");
    ignore.push_back(prefix + "h.{i}.attn.masked_bias");
  }
  for (const auto& t : spec.transpose) out.transposed.push_back(compile(t, refuse));
  for (const auto& t : ignore) out.ignored.push_back(compile(t, refuse));
  return out;
}

// The one error listing every missing, unexpected and misshaped tensor (missing and unexpected only when strict).
[[noreturn]] void refuse_mismatch(const InitSpec& spec, const std::string& head,
                                  const std::vector<std::string>& missing, const std::vector<std::string>& unexpected,
                                  const std::vector<std::string>& misshaped) {
  std::ostringstream os;
  os << head << " does not match the model (strict = " << (spec.strict ? "true" : "false")
     << (spec.preset.empty() ? "" : ", preset = \"" + spec.preset + "\"") << "): " << missing.size() << " missing, "
     << unexpected.size() << " unexpected, " << misshaped.size() << " misshaped";
  if (spec.strict)
    for (const auto& l : missing) os << "\n  missing (the model's, not in the file): " << l;
  if (spec.strict)
    for (const auto& l : unexpected) os << "\n  unexpected (in the file, used by no model tensor): " << l;
  for (const auto& l : misshaped) os << "\n  misshaped: " << l;
  os << "\n"
     << (misshaped.empty() ? "strict = false loads the tensors that match and leaves the rest as the config "
                             "initializes them; "
                           : "")
     << "[init] map, transpose and ignore say which file tensor is which (docs/weights.md)";
  throw ConfigError(os.str());
}

}  // namespace

InitialWeights load_initial_weights(const InitSpec& spec, const ModelSpec& m, const OptimizerSpec& opt) {
  const auto [targets, params, shadows] = model_tensors(m, opt);

  const std::string& path = spec.from;
  const Source src(path);
  const auto& have = src.shapes();
  if (spec.ema && !src.checkpoint())
    throw ConfigError(spec.where + ": [init] weights = \"ema\" applies to a Kiln checkpoint; " + path +
                      " is a safetensors file (its tensors are what it holds)");

  const NameRules nr = name_rules(spec, have);
  const std::string& prefix = nr.prefix;

  std::vector<Plan> plans;
  std::vector<std::string> missing, misshaped;
  std::set<std::string> used;
  Bindings b;
  for (const auto& [name, shape] : targets) {
    Plan p{name, name, shape, false, false, "the same name"};
    for (const auto& r : nr.rules)
      if (match(r.kiln, name, b)) {
        p.file = substitute(r.file, b);
        p.transpose = r.rule.transpose;
        p.first_rows = r.rule.first_rows;
        p.why = r.rule.where;
        break;
      }
    for (const auto& t : nr.transposed)
      if (match(t, name, b)) p.transpose = true;
    if (spec.ema && params.count(name)) p.file += "/ema";
    auto it = have.find(p.file);
    if (it == have.end()) {
      std::string line = "'" + name + "' " + shape.str();
      if (p.file != name) line += " <- '" + p.file + "' (" + p.why + ")";
      if (spec.ema && params.count(name) && have.count(name))
        line += ": the checkpoint holds no EMA shadows (weights = \"raw\" loads its parameters)";
      missing.push_back(line);
      continue;
    }
    used.insert(p.file);
    const Shape& fs = it->second;
    Shape want = shape;
    bool ok;
    if (p.transpose) {
      ok = fs.rank() == 2 && shape.rank() == 2 && fs[0] == shape[1] && fs[1] == shape[0];
    } else if (p.first_rows) {
      ok = fs.rank() == shape.rank() && fs.rank() > 0 && fs[0] >= shape[0] &&
           std::equal(fs.dims().begin() + 1, fs.dims().end(), shape.dims().begin() + 1);
    } else {
      ok = fs == shape;
    }
    if (!ok) {
      std::string line = "the model's '" + name + "' is " + shape.str() + ", the file's '" + p.file + "' is " +
                         fs.str() +
                         (p.transpose    ? " (transposed: it must be the model's shape reversed)"
                          : p.first_rows ? " (first rows: the file's may have more rows, the other dims equal)"
                                         : "");
      if (!p.transpose && fs.rank() == 2 && shape.rank() == 2 && fs[0] == shape[1] && fs[1] == shape[0])
        line += "; a (out, in) weight such as nn.Linear's is loaded with transpose = [\"" + name + "\"]";
      misshaped.push_back(line);
      continue;
    }
    plans.push_back(p);
  }

  // A tied lm_head.weight that GPT-2 files may hold is wte.weight again: used when it equals it.
  if (spec.preset == "gpt2" && have.count("lm_head.weight") && !used.count("lm_head.weight") &&
      have.count(prefix + "wte.weight") && used.count(prefix + "wte.weight") &&
      have.at("lm_head.weight") == have.at(prefix + "wte.weight") &&
      src.same_values("lm_head.weight", prefix + "wte.weight"))
    used.insert("lm_head.weight");
  std::vector<std::string> unexpected;
  for (const auto& [name, shape] : have) {
    if (used.count(name)) continue;
    if (src.checkpoint() && name.find('/') != std::string::npos) continue;  // optimizer state, EMA: not weights
    if (spec.ema && used.count(name + "/ema")) continue;                    // the raw values of a loaded shadow
    bool skip = false;
    for (const auto& p : nr.ignored) skip = skip || match(p, name, b);
    if (!skip) unexpected.push_back("'" + name + "' " + shape.str());
  }

  const std::string head =
      (spec.where.empty() ? std::string("[init] from") : spec.where) + " = \"" + spec.from_as_set + "\" (" + path + ")";
  if (!misshaped.empty() || (spec.strict && (!missing.empty() || !unexpected.empty())))
    refuse_mismatch(spec, head, missing, unexpected, misshaped);
  if (plans.empty())
    throw ConfigError(head + ": none of the model's " + std::to_string(targets.size()) +
                      " parameters and buffers is in the file (the names differ: see [init] map and preset, "
                      "docs/weights.md)");

  InitialWeights w;
  uint64_t values = 0;
  for (const auto& p : plans) {
    HostTensor t = src.read(path, p.file, p.transpose, p.first_rows ? p.shape[0] : -1);
    values += t.data.size();
    const std::string shadow = p.target + "/ema";
    if (shadows.count(shadow)) w.tensors.emplace(shadow, t);
    w.tensors.emplace(p.target, std::move(t));
  }
  for (const auto& l : missing) w.missing.push_back(l);
  for (const auto& l : unexpected) w.unused.push_back(l);
  std::ostringstream os;
  os << "initialized " << plans.size() << " of the model's " << targets.size() << " parameters and buffers ("
     << thousands(values) << " values) from " << path << " (" << src.dtypes()
     << (spec.preset.empty() ? "" : "; preset " + spec.preset) << ")";
  if (!w.missing.empty())
    os << "\nstrict = false: " << w.missing.size()
       << " not in the file start as the config initializes them: " << list_text(w.missing);
  if (!w.unused.empty())
    os << "\nstrict = false: " << w.unused.size() << " of the file's tensors are not used: " << list_text(w.unused);
  w.summary = os.str();
  return w;
}

}  // namespace kiln
