// TOML configuration with validation: every error names file:line, the key, what was given and what was expected.
#include "kiln/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "toml_bounds.hpp"

namespace kiln {

class ConfigDocument {
 public:
  std::string file;
  toml::table root;
  std::vector<std::string> overridden;  // dotted paths set by --set
  mutable std::mutex mu;
  mutable std::set<std::pair<const void*, std::string>> used;
  // Tables made by ConfigNode::rewritten, and for each (sub)table of a copy the table it was copied from: toml++'s
  // copies carry no source lines, so errors take their lines from the original.
  std::vector<std::unique_ptr<toml::table>> copies;
  std::map<const void*, const void*> origin;
};

namespace {

const toml::table& tbl(const void* p) { return *static_cast<const toml::table*>(p); }

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

std::string show(const toml::node& n);
std::string show(const toml::node& n) {
  std::ostringstream os;
  if (auto s = n.as_string()) {
    os << '"' << s->get() << '"';
  } else if (n.is_table()) {
    os << "{...}";
  } else if (auto i = n.as_integer()) {
    os << i->get();
  } else if (auto f = n.as_floating_point()) {
    os << f->get();
  } else if (auto b = n.as_boolean()) {
    os << (b->get() ? "true" : "false");
  } else if (auto a = n.as_array()) {
    os << "[";
    for (size_t k = 0; k < a->size(); ++k) os << (k ? ", " : "") << show(*a->get(k));
    os << "]";
  } else {
    os << "a date/time";
  }
  return os.str();
}

// Splits "model.layers[2].units" into ("model", "layers", "[2]", "units"). Keys are TOML bare keys (letters,
// digits, '_', '-'), indices are decimal; anything else (an empty key as in "train..epochs", "[abc]", a missing
// '.' or ']') is a ConfigError naming the --set and the position, never a guess.
std::vector<std::string> split_path(const std::string& path, const std::string& assignment) {
  auto bad = [&](size_t at, const std::string& why) -> std::vector<std::string> {
    throw ConfigError("--set '" + assignment + "': the key '" + path + "' is malformed at character " +
                      std::to_string(at + 1) + ": " + why +
                      " (expected dotted keys with [index] for array elements, e.g. model.layers[2].units)");
  };
  auto bare = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  std::vector<std::string> parts;
  if (path.empty()) return bad(0, "the key is empty");
  size_t i = 0;
  bool need_key = true;  // at the start and after '.', a key must follow
  while (i < path.size()) {
    const char c = path[i];
    if (bare(c)) {
      if (!need_key) return bad(i, "expected '.' or '[' after '" + parts.back() + "'");
      size_t j = i;
      while (j < path.size() && bare(path[j])) ++j;
      parts.push_back(path.substr(i, j - i));
      i = j;
      need_key = false;
    } else if (c == '.') {
      if (need_key) return bad(i, parts.empty() ? "the key starts with '.'" : "an empty key between dots");
      need_key = true;
      ++i;
    } else if (c == '[') {
      if (need_key) return bad(i, "an [index] must follow a key name");
      const size_t close = path.find(']', i);
      if (close == std::string::npos) return bad(i, "'[' is never closed");
      const std::string digits = path.substr(i + 1, close - i - 1);
      if (digits.empty() || digits.size() > 9 ||
          !std::all_of(digits.begin(), digits.end(), [](char d) { return d >= '0' && d <= '9'; }))
        return bad(i + 1, "the index '" + digits + "' is not a non-negative integer");
      parts.push_back("[" + digits + "]");
      i = close + 1;
    } else {
      return bad(i, std::string("unexpected character '") + c + "'");
    }
  }
  if (need_key) return bad(path.size() - 1, "the key ends with '.'");
  return parts;
}

// Applies `--set key=value` to `root`; returns the key.
std::string apply_override(toml::table& root, const std::string& file, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected key=value, e.g. --set train.epochs=1");
  std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  // The value is parsed as the TOML document "v = <value>" and only v is kept: the lines after a line break became
  // other keys of that document and were dropped without a word (or, where the first line is no TOML value, part
  // of a string).
  if (const size_t br = assignment.find_first_of("\r\n"); br != std::string::npos) {
    const size_t next = assignment.find_first_not_of("\r\n", br);
    const std::string rest = next == std::string::npos ? "" : assignment.substr(next);
    throw ConfigError("--set '" + one_line(assignment) + "': a --set is one line, found a line break" +
                      (rest.empty() ? std::string() : " before '" + one_line(rest, 40) + "'") +
                      "; give each key its own --set and write a line break inside a string as \\n (\"a\\nb\")");
  }
  while (!key.empty() && key.back() == ' ') key.pop_back();
  while (!key.empty() && key.front() == ' ') key.erase(key.begin());
  auto parts = split_path(key, assignment);
  if (parts.size() > kMaxTomlKeyParts)
    throw ConfigError("--set '" + one_line(assignment) + "': the key has " + std::to_string(parts.size()) +
                      " parts; at most " + std::to_string(kMaxTomlKeyParts) + " are accepted");
  if (auto e = find_toml_excess("v = " + value)) throw ConfigError("--set '" + one_line(assignment) + "': " + e->what);
  // The value is TOML (1, 0.5, true, "x", [1, 2]); a bare word is taken as a string.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  toml::node* cur = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const auto& p = parts[i];
    if (p.front() == '[') {
      auto* arr = cur->as_array();
      const size_t idx = std::stoul(p.substr(1, p.size() - 2));  // at most 9 digits: split_path checked
      if (!arr) throw ConfigError("--set " + key + ": '" + parts[i - 1] + "' is not an array in " + file);
      if (idx >= arr->size())
        throw ConfigError("--set " + key + ": " + file + " has no element " + p + " there (the array has " +
                          std::to_string(arr->size()) + ")");
      cur = arr->get(idx);
    } else {
      auto* t = cur->as_table();
      if (!t) throw ConfigError("--set " + key + ": '" + p + "' is not inside a table in " + file);
      if (!t->contains(p)) {
        bool next_is_index = parts[i + 1].front() == '[';
        if (next_is_index) throw ConfigError("--set " + key + ": " + file + " has no array '" + p + "'");
        t->insert(p, toml::table{});
      }
      cur = t->get(p);
    }
  }
  const auto& last = parts.back();
  if (last.front() == '[') throw ConfigError("--set " + key + ": the last part must be a key name");
  auto* t = cur->as_table();
  if (!t) throw ConfigError("--set " + key + ": the parent of '" + last + "' is not a table in " + file);
  t->insert_or_assign(last, std::move(*parsed.get("v")));
  return key;
}

}  // namespace

ConfigNode::ConfigNode(std::shared_ptr<ConfigDocument> doc, const void* table, std::string path)
    : doc_(std::move(doc)), table_(table), path_(std::move(path)) {}

bool ConfigNode::has(const std::string& key) const { return tbl(table_).contains(key); }

bool ConfigNode::is_table(const std::string& key) const {
  const toml::node* n = tbl(table_).get(key);
  return n && n->is_table();
}

std::vector<std::string> ConfigNode::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tbl(table_)) out.emplace_back(k.str());
  return out;
}

std::string ConfigNode::where(const std::string& key) const {
  std::ostringstream os;
  std::string full = key.empty() ? path_ : (path_.empty() ? key : path_ + "." + key);
  // A value given on the command line has no line in the file: name the --set that gave it.
  if (std::find(doc_->overridden.begin(), doc_->overridden.end(), full) != doc_->overridden.end())
    return doc_->file + ": key '" + full + "' (from --set " + full + "=...)";
  os << doc_->file;
  const void* lines = table_;  // a rewritten copy's lines are its original's
  {
    std::lock_guard lk(doc_->mu);
    if (auto it = doc_->origin.find(table_); it != doc_->origin.end()) lines = it->second;
  }
  const toml::node* n = key.empty() ? static_cast<const toml::node*>(&tbl(lines)) : tbl(lines).get(key);
  if (!n) n = &tbl(lines);  // a missing key: the line of the table it belongs in
  if (n && n->source().begin.line > 0) os << ":" << n->source().begin.line;
  os << ": key '" << (full.empty() ? "<root>" : full) << "'";
  return os.str();
}

void ConfigNode::fail(const std::string& key, const std::string& message) const {
  throw ConfigError(where(key) + ": " + message);
}

void ConfigNode::ignore(const std::string& key) const {
  std::lock_guard lk(doc_->mu);
  doc_->used.insert({table_, key});
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The key of `keys` closest to `key` within an edit distance of 2, or "".
std::string nearest_key(const std::vector<std::string>& keys, const std::string& key) {
  std::string hint;
  size_t best = 3;
  for (const auto& k : keys)
    if (size_t d = edit_distance(k, key); d < best) best = d, hint = k;
  return hint;
}

const toml::node* lookup(const ConfigNode& c, const void* table, ConfigDocument& doc, const std::string& key,
                         bool required) {
  {
    std::lock_guard lk(doc.mu);
    doc.used.insert({table, key});
  }
  const toml::node* n = tbl(table).get(key);
  if (!n && required) {
    // A misspelled key is the usual cause: name the nearest key present.
    std::vector<std::string> present;
    for (const auto& [k, v] : tbl(table)) present.emplace_back(k.str());
    const std::string hint = nearest_key(present, key);
    std::string at;
    if (!hint.empty())
      if (const toml::node* h = tbl(table).get(hint); h && h->source().begin.line > 0)
        at = " (line " + std::to_string(h->source().begin.line) + ")";
    c.fail(key, "missing (required)" +
                    (hint.empty() ? std::string() : "; the table has '" + hint + "'" + at + ": misspelled?"));
  }
  return n;
}
}  // namespace

int64_t ConfigNode::get_int(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, true);
  if (auto v = n->as_integer()) return v->get();
  // A whole float (3.0) reads as 3. The range check comes first: converting a float outside int64's range (1e24),
  // inf or NaN is undefined behaviour, not a number to compare.
  if (auto f = n->as_floating_point()) {
    const double d = f->get();
    if (std::isfinite(d) && d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d)) return static_cast<int64_t>(d);
    if (std::isfinite(d) && d == std::trunc(d))
      fail(key, "expected an integer, found float " + show(*n) + ", outside the 64-bit integer range");
  }
  fail(key, "expected an integer, found " + type_name(*n) + " " + show(*n));
}
int64_t ConfigNode::get_int(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : (ignore(key), dflt);
}

double ConfigNode::get_float(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, true);
  if (auto v = n->as_floating_point()) return v->get();
  if (auto v = n->as_integer()) return static_cast<double>(v->get());
  fail(key, "expected a number, found " + type_name(*n) + " " + show(*n));
}
double ConfigNode::get_float(const std::string& key, double dflt) const {
  return has(key) ? get_float(key) : (ignore(key), dflt);
}

bool ConfigNode::get_bool(const std::string& key, bool dflt) const {
  auto* n = lookup(*this, table_, *doc_, key, false);
  if (!n) return dflt;
  if (auto v = n->as_boolean()) return v->get();
  fail(key, "expected true or false, found " + type_name(*n) + " " + show(*n));
}

std::string ConfigNode::get_string(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, true);
  if (auto v = n->as_string()) return v->get();
  fail(key, "expected a string, found " + type_name(*n) + " " + show(*n));
}
std::string ConfigNode::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : (ignore(key), dflt);
}

std::string ConfigNode::get_choice(const std::string& key, const std::vector<std::string>& choices,
                                   const std::string& dflt) const {
  std::string v = get_string(key, dflt);
  for (const auto& c : choices)
    if (c == v) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
  fail(key, "expected one of " + list + ", found \"" + v + "\"");
}

std::vector<int64_t> ConfigNode::get_int_list(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, true);
  std::vector<int64_t> out;
  if (auto v = n->as_integer()) return {v->get()};
  auto* arr = n->as_array();
  if (!arr) fail(key, "expected a list of integers, found " + type_name(*n) + " " + show(*n));
  for (const auto& e : *arr) {
    auto i = e.as_integer();
    if (!i) fail(key, "expected a list of integers, found an element " + show(e));
    out.push_back(i->get());
  }
  return out;
}
std::vector<int64_t> ConfigNode::get_int_list(const std::string& key, std::vector<int64_t> dflt) const {
  return has(key) ? get_int_list(key) : (ignore(key), dflt);
}

bool ConfigNode::is_list(const std::string& key) const {
  auto* n = tbl(table_).get(key);
  return n && n->is_array();
}

std::vector<std::string> ConfigNode::get_string_list(const std::string& key, std::vector<std::string> dflt) const {
  auto* n = lookup(*this, table_, *doc_, key, false);
  if (!n) return dflt;
  if (auto s = n->as_string()) return {s->get()};
  auto* arr = n->as_array();
  if (!arr) fail(key, "expected a list of strings, found " + type_name(*n) + " " + show(*n));
  std::vector<std::string> out;
  for (const auto& e : *arr) {
    auto s = e.as_string();
    if (!s) fail(key, "expected a list of strings, found an element " + show(e));
    out.push_back(s->get());
  }
  return out;
}

std::vector<double> ConfigNode::get_float_list(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, true);
  if (auto v = n->as_floating_point()) return {v->get()};
  if (auto v = n->as_integer()) return {static_cast<double>(v->get())};
  auto* arr = n->as_array();
  if (!arr) fail(key, "expected a list of numbers, found " + type_name(*n) + " " + show(*n));
  std::vector<double> out;
  for (const auto& e : *arr) {
    if (auto f = e.as_floating_point())
      out.push_back(f->get());
    else if (auto i = e.as_integer())
      out.push_back(static_cast<double>(i->get()));
    else
      fail(key, "expected a list of numbers, found an element " + show(e));
  }
  return out;
}
std::vector<double> ConfigNode::get_float_list(const std::string& key, std::vector<double> dflt) const {
  return has(key) ? get_float_list(key) : (ignore(key), dflt);
}

std::pair<int64_t, int64_t> ConfigNode::get_pair(const std::string& key, std::pair<int64_t, int64_t> dflt) const {
  if (!has(key)) return ignore(key), dflt;
  auto v = get_int_list(key);
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() == 2) return {v[0], v[1]};
  fail(key, "expected an integer or a list of two integers, found a list of " + std::to_string(v.size()));
}

std::string ConfigNode::get_size_text(const std::string& key, const std::string& dflt) const {
  auto* n = lookup(*this, table_, *doc_, key, false);
  if (!n) return dflt;
  if (auto s = n->as_string()) return s->get();
  if (auto i = n->as_integer()) return std::to_string(i->get());
  fail(key, "expected a size like \"1200MiB\", \"60%\" or a byte count, found " + type_name(*n) + " " + show(*n));
}

std::optional<ConfigNode> ConfigNode::table(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, false);
  if (!n) return std::nullopt;
  auto* t = n->as_table();
  if (!t) fail(key, "expected a table, found " + type_name(*n) + " " + show(*n));
  return ConfigNode(doc_, t, path_.empty() ? key : path_ + "." + key);
}

std::vector<ConfigNode> ConfigNode::table_array(const std::string& key) const {
  auto* n = lookup(*this, table_, *doc_, key, false);
  std::vector<ConfigNode> out;
  if (!n) return out;
  auto* arr = n->as_array();
  if (!arr) fail(key, "expected an array of tables, found " + type_name(*n) + " " + show(*n));
  std::string base = path_.empty() ? key : path_ + "." + key;
  for (size_t i = 0; i < arr->size(); ++i) {
    auto* t = arr->get(i)->as_table();
    if (!t) fail(key, "expected an array of tables, element " + std::to_string(i) + " is " + type_name(*arr->get(i)));
    out.emplace_back(doc_, t, base + "[" + std::to_string(i) + "]");
  }
  return out;
}

namespace {
// Rewrites every string under `n` in place; records each sub-table's original in `origin`.
void rewrite_strings(toml::node& n, const toml::node& from, const std::string& key,
                     const std::function<std::string(const std::string&, const std::string&)>& f,
                     std::map<const void*, const void*>& origin) {
  if (auto* s = n.as_string()) {
    *s = f(key, s->get());
  } else if (auto* a = n.as_array()) {
    const auto* fa = from.as_array();
    for (size_t i = 0; i < a->size(); ++i) rewrite_strings(*a->get(i), *fa->get(i), key, f, origin);
  } else if (auto* t = n.as_table()) {
    const auto* ft = from.as_table();
    origin[t] = ft;
    for (auto&& [k, v] : *t) rewrite_strings(v, *ft->get(k.str()), key.empty() ? std::string(k.str()) : key, f, origin);
  }
}
}  // namespace

ConfigNode ConfigNode::rewritten(
    const std::function<std::string(const std::string& key, const std::string& value)>& rewrite) const {
  auto copy = std::make_unique<toml::table>(tbl(table_));
  std::map<const void*, const void*> origin;
  rewrite_strings(*copy, tbl(table_), "", rewrite, origin);
  // A copy of a copy takes its lines from the first original.
  std::lock_guard lk(doc_->mu);
  for (auto& [c, o] : origin)
    if (auto it = doc_->origin.find(o); it != doc_->origin.end()) o = it->second;
  doc_->origin.insert(origin.begin(), origin.end());
  const void* t = copy.get();
  doc_->copies.push_back(std::move(copy));
  return ConfigNode(doc_, t, path_);
}

void ConfigNode::finish() const {
  std::vector<std::string> unknown, known;
  {
    std::lock_guard lk(doc_->mu);
    for (const auto& [k, v] : tbl(table_))
      if (!doc_->used.count({table_, std::string(k.str())})) unknown.emplace_back(k.str());
    if (unknown.empty()) return;
    // Every key this table's reader asked for: `used` is ordered by table first, so only this table's range
    // (a scan of the whole set made checking N tables O(N^2)).
    for (auto it = doc_->used.lower_bound({table_, std::string()}); it != doc_->used.end() && it->first == table_; ++it)
      known.push_back(it->second);
  }
  std::string keys;
  for (const auto& k : unknown) keys += (keys.empty() ? "'" : ", '") + k + "'";
  // The nearest key the reader knows, when one is close: "epoch" -> "epochs".
  const std::string hint = nearest_key(known, unknown.front());
  fail(unknown.front(),
       "unknown key" + std::string(unknown.size() > 1 ? "s " : " ") + keys +
           (path_.empty() ? "" : " in [" + path_ + "]") +
           (hint.empty() ? " (misspelled? see docs/user_guide.md)" : " (did you mean '" + hint + "'?)"));
}

namespace {
// Parses `text` as the config `name` once it is within the bounds toml++ handles without crashing.
toml::table parse_config(const std::string& text, const std::string& name) {
  if (auto e = find_toml_excess(text)) throw ConfigError(name + ":" + std::to_string(e->line) + ": " + e->what);
  try {
    return toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << name << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": TOML syntax error: " << e.description();
    throw ConfigError(os.str());
  }
}

std::string too_large(const std::string& name, uint64_t bytes) {
  std::ostringstream os;
  os.precision(1);
  os << name << ": the config is " << bytes << " bytes (" << std::fixed << static_cast<double>(bytes) / (1 << 20)
     << " MiB); a config is at most " << (kMaxConfigBytes >> 20) << " MiB";
  return os.str();
}
}  // namespace

Config Config::load_file(const std::string& path, const std::vector<std::string>& overrides) {
  if (!std::filesystem::exists(path)) throw ConfigError(path + ": config file not found");
  if (!std::filesystem::is_regular_file(path))
    throw ConfigError(path + ": expected a TOML file, found " +
                      (std::filesystem::is_directory(path) ? std::string("a directory")
                                                           : std::string("something that is not a regular file")));
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxConfigBytes) throw ConfigError(too_large(path, size));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the config file for reading");
  // At most one byte past the bound: a file that grew after file_size() is still refused, never read whole.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) throw ConfigError(path + ": reading the config file failed");
  if (text.size() > kMaxConfigBytes) throw ConfigError(too_large(path, text.size()));
  Config c;
  c.doc_ = std::make_shared<ConfigDocument>();
  c.doc_->file = path;
  c.doc_->root = parse_config(text, path);
  for (const auto& o : overrides) c.doc_->overridden.push_back(apply_override(c.doc_->root, path, o));
  return c;
}

Config Config::load_string(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  if (text.size() > kMaxConfigBytes) throw ConfigError(too_large(name, text.size()));
  Config c;
  c.doc_ = std::make_shared<ConfigDocument>();
  c.doc_->file = name;
  c.doc_->root = parse_config(text, name);
  for (const auto& o : overrides) c.doc_->overridden.push_back(apply_override(c.doc_->root, name, o));
  return c;
}

ConfigNode Config::root() const { return ConfigNode(doc_, &doc_->root, ""); }
const std::string& Config::file() const { return doc_->file; }
std::string Config::resolved_text() const {
  std::ostringstream os;
  os << toml::toml_formatter(doc_->root);
  return os.str();
}

std::string Config::base_dir() const {
  auto p = std::filesystem::path(doc_->file).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace kiln
