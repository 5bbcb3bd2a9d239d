// A text source's vocabulary as saved with a run (vocab.json): parsed, and ids to text and back.
#include "kiln/vocabulary.hpp"

#include <cctype>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "kiln/error.hpp"

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

}  // namespace kiln
