// A small TOML lexer that only measures: dotted keys and table headers (parts) and arrays and inline tables (depth).
// It skips strings and comments as TOML does, so a '.', '[' or '{' inside them never counts.
#include "toml_bounds.hpp"

#include <vector>

namespace kiln {

namespace {

bool bare_key_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  // Bytes >= 0x80: a UTF-8 key character (toml++ accepts some); counting it as a key character only matters for
  // where the key ends, not for its parts.
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         u >= 0x80;
}

class Scan {
 public:
  explicit Scan(std::string_view s) : s_(s) {}

  std::optional<TomlExcess> run() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') {
        ++line_, ++i_;
        if (open_.empty()) in_key_ = true;  // a new line at the top level starts a key or a header
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (in_key_) {
        if (open_.empty() && c == '[') {
          if (auto e = header()) return e;
        } else if (c == '}' && !open_.empty()) {  // "{}" or "{ }"
          open_.pop_back(), ++i_;
          in_key_ = false;
        } else if (bare_key_char(c) || c == '"' || c == '\'') {
          if (auto e = key()) return e;
        } else {
          ++i_;  // not TOML: the parser says so
        }
      } else if (c == '"' || c == '\'') {
        skip_string();
      } else if (c == '[' || c == '{') {
        open_.push_back(c), ++i_;
        in_key_ = c == '{';
        if (open_.size() > kMaxTomlNesting && deep_line_ == 0) deep_line_ = line_;
        if (open_.size() > deepest_) deepest_ = open_.size();
      } else if (c == ']' || c == '}') {
        if (!open_.empty()) open_.pop_back();
        ++i_;
        if (deep_line_ && open_.size() <= kMaxTomlNesting) return deep();
      } else if (c == ',') {
        in_key_ = !open_.empty() && open_.back() == '{';
        ++i_;
      } else {
        ++i_;  // a number, a boolean, a date: nothing to measure
      }
    }
    if (deep_line_) return deep();
    return std::nullopt;
  }

 private:
  // At a quote: past the string (basic, literal, or either multi-line), counting the lines inside. A single-line
  // string left open stops at the end of its line.
  void skip_string() {
    const char q = s_[i_];
    const bool escapes = q == '"';
    if (s_.compare(i_, 3, std::string(3, q)) == 0) {
      i_ += 3;
      while (i_ < s_.size()) {
        if (s_[i_] == '\n') ++line_;
        if (escapes && s_[i_] == '\\') {
          if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') ++line_;
          i_ += 2;
        } else if (s_.compare(i_, 3, std::string(3, q)) == 0) {
          i_ += 3;
          for (int extra = 0; extra < 2 && i_ < s_.size() && s_[i_] == q; ++extra) ++i_;  // '"""a""""' ends in a '"'
          return;
        } else {
          ++i_;
        }
      }
      return;
    }
    ++i_;
    while (i_ < s_.size() && s_[i_] != '\n') {
      if (escapes && s_[i_] == '\\' && i_ + 1 < s_.size() && s_[i_ + 1] != '\n') {
        i_ += 2;
      } else if (s_[i_++] == q) {
        return;
      }
    }
  }

  // A key (of a key = value line or in an inline table): bare and quoted parts separated by dots.
  std::optional<TomlExcess> key() {
    const size_t from = i_, at = line_;
    size_t parts = 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '"' || c == '\'') {
        skip_string();
      } else if (c == '.') {
        ++parts, ++i_;
      } else if (bare_key_char(c) || c == ' ' || c == '\t') {
        ++i_;
      } else {
        break;
      }
    }
    size_t to = i_;
    while (to > from && (s_[to - 1] == ' ' || s_[to - 1] == '\t')) --to;
    if (parts > kMaxTomlKeyParts)
      return TomlExcess{at, "a dotted key of " + std::to_string(parts) + " parts ('" +
                                one_line(s_.substr(from, to - from)) + "'); at most " +
                                std::to_string(kMaxTomlKeyParts) + " parts are accepted"};
    if (i_ < s_.size() && s_[i_] == '=') ++i_, in_key_ = false;
    return std::nullopt;
  }

  // At the '[' of a table header ("[a.b]" or "[[a.b]]"), which ends on its line.
  std::optional<TomlExcess> header() {
    const size_t from = i_;
    i_ += s_.compare(i_, 2, "[[") == 0 ? 2 : 1;
    size_t parts = 1;
    while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '#') {
      const char c = s_[i_];
      if (c == '"' || c == '\'') {
        skip_string();
        continue;
      }
      ++i_;
      if (c == '.') ++parts;
      if (c == ']') {
        if (i_ < s_.size() && s_[i_] == ']') ++i_;
        break;
      }
    }
    if (parts > kMaxTomlKeyParts)
      return TomlExcess{line_, "a table header of " + std::to_string(parts) + " parts ('" +
                                   one_line(s_.substr(from, i_ - from)) + "'); at most " +
                                   std::to_string(kMaxTomlKeyParts) + " parts are accepted"};
    return std::nullopt;
  }

  TomlExcess deep() const {
    return TomlExcess{deep_line_, "arrays and inline tables nested " + std::to_string(deepest_) + " deep; at most " +
                                      std::to_string(kMaxTomlNesting) + " levels are accepted"};
  }

  std::string_view s_;
  size_t i_ = 0, line_ = 1;
  bool in_key_ = true;      // a key (or at the top level a header) comes next, else a value
  std::vector<char> open_;  // the arrays ('[') and inline tables ('{') open, innermost last
  size_t deep_line_ = 0;    // the line where nesting first went past the bound (reported once the nest closes)
  size_t deepest_ = 0;
};

}  // namespace

std::optional<TomlExcess> find_toml_excess(std::string_view text) { return Scan(text).run(); }

std::string one_line(std::string_view s, size_t max) {
  std::string out;
  for (size_t k = 0; k < s.size() && k < max; ++k) {
    if (s[k] == '\n')
      out += "\\n";
    else if (s[k] == '\r')
      out += "\\r";
    else
      out += s[k];
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace kiln
