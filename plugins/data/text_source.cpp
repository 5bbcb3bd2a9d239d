// Sources for language models, as nanoGPT prepares and reads its data:
//  - `text`: a UTF-8 file (plain or gzip) read into memory; vocabulary = the sorted distinct characters
//    (data/shakespeare_char/prepare.py) or the 256 byte values; the first (1 - val_fraction) of the tokens are the
//    train split, the rest the val split (int(n * 0.9), as prepare.py cuts);
//  - `tokens`: a flat little-endian uint16 file of token ids (prepare.py's train.bin / val.bin): read into memory
//    once, at the source's first read, when the file fits the decoded budget; else read a window at a time by pread
//    (memory stays bounded whatever its size).
// Both yield windows of block_size tokens x = data[i : i+T] and their next tokens y = data[i+1 : i+T+1] (ids as
// floats, shapes (T) and (T)), at seeded random offsets (train.py's get_batch: a fresh uniform offset in
// [0, n - T) per example) or sequentially (offsets 0, T, 2T, ...).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>

#include "byte_reader.hpp"
#include "common.hpp"
#include "kiln/allocator.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"')
      o += "\\\"";
    else if (c == '\\')
      o += "\\\\";
    else if (c == '\n')
      o += "\\n";
    else if (c == '\t')
      o += "\\t";
    else if (c == '\r')
      o += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string utf8_encode(uint32_t cp) {
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

// Strict UTF-8 (what Python's open(...).read() accepts): no overlong forms, surrogates or values past U+10FFFF.
std::vector<uint32_t> decode_utf8(const std::string& bytes, const ByteReader& r) {
  std::vector<uint32_t> out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    uint32_t cp = 0;
    size_t len = 0;
    if (c < 0x80)
      cp = c, len = 1;
    else if ((c & 0xe0) == 0xc0)
      cp = c & 0x1f, len = 2;
    else if ((c & 0xf0) == 0xe0)
      cp = c & 0x0f, len = 3;
    else if ((c & 0xf8) == 0xf0)
      cp = c & 0x07, len = 4;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xc0) == 0x80;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      char b[8];
      std::snprintf(b, sizeof b, "0x%02x", c);
      r.fail("byte offset " + std::to_string(i) + " (byte " + b + "): not valid UTF-8; vocab = \"chars\" reads UTF-8 " +
             "text, use vocab = \"bytes\" for any other file");
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

enum class Sampling : uint8_t { random, sequential };

// Windows over n tokens: example k of epoch e starts at hash(seed, e, k) % (n - T) (random) or k * T (sequential).
// Any window can be read directly (at(k)), so both sources have random access.
class WindowSource : public Stage {
 public:
  WindowSource(std::string name, int64_t tokens, int64_t block, Sampling sampling, int64_t examples, uint64_t seed)
      : name_(std::move(name)), n_(tokens), t_(block), sampling_(sampling), examples_(examples), seed_(seed) {}

  std::string name() const override { return name_; }
  Shape example_shape() const override { return {t_}; }
  Shape label_shape() const override { return {t_}; }
  int64_t size_hint() const override { return examples_; }
  bool random_access() const override { return true; }
  void reset(uint64_t epoch) override {
    epoch_ = epoch;
    pos_ = 0;
  }

  std::optional<Element> next() override {
    if (pos_ >= examples_) return std::nullopt;
    ScopedTimer timer(counters_.busy_seconds);
    Element e = window(static_cast<uint64_t>(pos_));
    ++pos_;
    return e;
  }

  Element at(uint64_t k) override {
    if (k >= static_cast<uint64_t>(examples_))
      throw Error(name_ + ": element " + std::to_string(k) + " asked, but the source gives " +
                  std::to_string(examples_) + " windows per epoch");
    return window(k);
  }

  StageState save() const override { return save_position(name(), static_cast<uint64_t>(pos_)); }
  void restore(const StageState& s) override {
    pos_ = static_cast<int64_t>(restore_position(s, name(), static_cast<uint64_t>(examples_), "windows"));
  }
  void collect_stats(std::vector<StageStats>& out) const override { counters_.report(name(), out); }

 protected:
  // Tokens [at, at + n) of the split; called from several threads at once by at().
  virtual void read(int64_t at, uint32_t* out, size_t n) = 0;
  SourceCounters counters_;

 private:
  Element window(uint64_t k) {
    const int64_t at =
        sampling_ == Sampling::random
            ? static_cast<int64_t>(hash_key(seed_, 0x746578 /* "tex" */, epoch_, k) % static_cast<uint64_t>(n_ - t_))
            : static_cast<int64_t>(k) * t_;
    std::vector<uint32_t> w(static_cast<size_t>(t_ + 1));
    read(at, w.data(), w.size());
    Element e;
    e.x = HostTensor(Shape{t_});
    e.y = HostTensor(Shape{t_});
    for (int64_t j = 0; j < t_; ++j) {
      e.x.data[static_cast<size_t>(j)] = static_cast<float>(w[static_cast<size_t>(j)]);
      e.y.data[static_cast<size_t>(j)] = static_cast<float>(w[static_cast<size_t>(j + 1)]);
    }
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  std::string name_;
  int64_t n_, t_;
  Sampling sampling_;
  int64_t examples_;
  uint64_t seed_;
  uint64_t epoch_ = 0;
  int64_t pos_ = 0;
};

// Token ids in as few bytes each as the largest needs (1, 2 or 4).
class CompactIds {
 public:
  explicit CompactIds(const std::vector<uint32_t>& ids) {
    const uint32_t top = ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end());
    width_ = top < 256 ? 1 : top < 65536 ? 2 : 4;
    bytes_.resize(ids.size() * width_);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (width_ == 1)
        bytes_[i] = static_cast<uint8_t>(ids[i]);
      else if (width_ == 2) {
        const auto v = static_cast<uint16_t>(ids[i]);
        std::memcpy(&bytes_[2 * i], &v, 2);
      } else
        std::memcpy(&bytes_[4 * i], &ids[i], 4);
    }
  }
  uint64_t bytes() const { return bytes_.size(); }
  void copy(int64_t at, uint32_t* out, size_t n) const {
    const auto a = static_cast<size_t>(at);
    for (size_t j = 0; j < n; ++j) {
      if (width_ == 1) {
        out[j] = bytes_[a + j];
      } else if (width_ == 2) {
        uint16_t v;
        std::memcpy(&v, &bytes_[2 * (a + j)], 2);
        out[j] = v;
      } else {
        std::memcpy(&out[j], &bytes_[4 * (a + j)], 4);
      }
    }
  }

 private:
  std::vector<uint8_t> bytes_;
  size_t width_ = 1;
};

class TextSource final : public WindowSource {
 public:
  TextSource(const std::vector<uint32_t>& ids, std::string vocab_json, uint64_t file_bytes, int64_t block,
             Sampling sampling, int64_t examples, uint64_t seed, uint64_t budget)
      : WindowSource("text", static_cast<int64_t>(ids.size()), block, sampling, examples, seed),
        ids_(ids),
        vocab_(std::move(vocab_json)) {
    counters_.bytes = file_bytes;  // read when the stage was built
    const ReadingPlan p = plan_reading(ids_.bytes(), budget);
    // The vocabulary is built from the whole file, so the text is decoded when the stage is built. Beyond the budget
    // only a plain file whose tokens are its bytes streams (StreamedTextSource): multi-byte UTF-8 or gzip text has no
    // window offsets to read at, so it stays in memory.
    reading_ =
        "decoded at build: " + format_bytes(static_cast<size_t>(ids_.bytes())) + " of token ids in memory" +
        (p.decoded
             ? ""
             : " (only a plain file of bytes or ASCII text streams: " + p.phrase.substr(p.phrase.find(": ") + 2) + ")");
  }
  std::string vocabulary() const override { return vocab_; }
  std::string reading() const override { return reading_; }

 private:
  void read(int64_t at, uint32_t* out, size_t n) override { ids_.copy(at, out, n); }
  CompactIds ids_;  // the split's token ids
  std::string vocab_;
  std::string reading_;
};

// A text source over a plain file whose tokens are its bytes (vocab = "bytes", or "chars" of a file that is all
// ASCII), when its ids do not fit the decoded budget: a window is a pread of T + 1 bytes of the split, each byte
// mapped to its id.
class StreamedTextSource final : public WindowSource {
 public:
  StreamedTextSource(std::unique_ptr<ByteReader> r, uint64_t begin, int64_t tokens, std::array<uint8_t, 256> ids,
                     std::string vocab_json, int64_t block, Sampling sampling, int64_t examples, uint64_t seed,
                     uint64_t budget)
      : WindowSource("text", tokens, block, sampling, examples, seed),
        r_(std::move(r)),
        begin_(begin),
        ids_(ids),
        vocab_(std::move(vocab_json)),
        reading_(plan_reading(static_cast<uint64_t>(tokens), budget).phrase) {
    counters_.bytes = r_->offset();  // the pass that found the vocabulary
    r_->count_into(&counters_.bytes);
  }
  std::string vocabulary() const override { return vocab_; }
  std::string reading() const override { return reading_; }

 private:
  void read(int64_t at, uint32_t* out, size_t n) override {
    std::vector<uint8_t> b(n);
    r_->read_at(begin_ + static_cast<uint64_t>(at), b.data(), n, "a window of " + std::to_string(n) + " tokens");
    for (size_t j = 0; j < n; ++j) out[j] = ids_[b[j]];
  }
  std::unique_ptr<ByteReader> r_;
  uint64_t begin_;
  std::array<uint8_t, 256> ids_;  // byte -> token id
  std::string vocab_;
  std::string reading_;
};

class TokensSource final : public WindowSource {
 public:
  TokensSource(std::unique_ptr<ByteReader> r, int64_t tokens, int64_t vocab, int64_t block, Sampling sampling,
               int64_t examples, uint64_t seed, uint64_t budget)
      : WindowSource("tokens", tokens, block, sampling, examples, seed),
        r_(std::move(r)),
        tokens_(tokens),
        vocab_(vocab),
        plan_(plan_reading(r_->file_bytes(), budget)) {
    r_->count_into(&counters_.bytes);
  }
  std::string reading() const override { return plan_.phrase; }

 private:
  void read(int64_t at, uint32_t* out, size_t n) override {
    if (plan_.decoded) {
      decode();
      for (size_t j = 0; j < n; ++j) out[j] = ids_[static_cast<size_t>(at) + j];
      return;
    }
    std::vector<unsigned char> bytes(n * 2);
    r_->read_at(static_cast<uint64_t>(at) * 2, bytes.data(), bytes.size(),
                "a window of " + std::to_string(n) + " tokens");
    for (size_t j = 0; j < n; ++j) {
      out[j] = static_cast<uint32_t>(bytes[2 * j]) | (static_cast<uint32_t>(bytes[2 * j + 1]) << 8);  // little-endian
      check(at + static_cast<int64_t>(j), out[j]);
    }
  }

  void check(int64_t index, uint32_t id) const {
    if (id >= static_cast<uint32_t>(vocab_))
      r_->fail("token " + std::to_string(index) + " (byte offset " + std::to_string(index * 2) + ") is id " +
               std::to_string(id) + ", not below vocab_size = " + std::to_string(vocab_) +
               "; was the file written with another tokenizer?");
  }

  // Reads and checks the whole file the first time a window is asked for (next() or at(), from any thread).
  void decode() {
    std::call_once(decoded_once_, [this] {
      std::vector<uint16_t> ids(static_cast<size_t>(tokens_));
      r_->read_at(0, ids.data(), ids.size() * 2, "the token ids");
      if constexpr (std::endian::native == std::endian::big)
        for (auto& v : ids) v = static_cast<uint16_t>((v >> 8) | (v << 8));
      for (size_t i = 0; i < ids.size(); ++i) check(static_cast<int64_t>(i), ids[i]);
      ids_ = std::move(ids);
    });
  }

  std::unique_ptr<ByteReader> r_;
  int64_t tokens_;
  int64_t vocab_;
  ReadingPlan plan_;
  std::once_flag decoded_once_;
  std::vector<uint16_t> ids_;  // decoded mode, after decode()
};

struct WindowKeys {
  int64_t block = 0;
  Sampling sampling = Sampling::random;
  int64_t examples = 0;  // 0: one epoch tiles the split once, (n - 1) / block_size windows
  uint64_t seed = 0;
};

WindowKeys read_window_keys(const ConfigNode& cfg, const StageContext& ctx) {
  WindowKeys k;
  k.block = cfg.get_int("block_size");
  if (k.block < 1 || k.block > (int64_t{1} << 24))
    cfg.fail("block_size", "expected the context length in tokens, 1 to 16777216, found " + std::to_string(k.block));
  k.sampling = cfg.get_choice("sampling", {"random", "sequential"}, "random") == "random" ? Sampling::random
                                                                                          : Sampling::sequential;
  k.examples = cfg.get_int("examples_per_epoch", 0);
  if (k.examples < 0)
    cfg.fail("examples_per_epoch", "expected a positive number of windows (0 or omitted: (tokens - 1) / block_size)");
  k.seed = static_cast<uint64_t>(cfg.get_int("seed", static_cast<int64_t>(ctx.seed)));
  return k;
}

// Windows per epoch: the split's (n - 1) / T unless examples_per_epoch says otherwise (sequential: at most that).
int64_t windows(const ConfigNode& cfg, const WindowKeys& k, int64_t n, const ByteReader& r, const std::string& what) {
  if (n < k.block + 1)
    r.fail(what + " holds " + std::to_string(n) + " tokens, fewer than the block_size + 1 = " +
           std::to_string(k.block + 1) + " one window and its next-token labels need; lower block_size (" +
           cfg.where("block_size") + ") or use more text");
  const int64_t tiles = (n - 1) / k.block;
  if (k.examples == 0) return tiles;
  if (k.sampling == Sampling::sequential && k.examples > tiles)
    cfg.fail("examples_per_epoch", "is " + std::to_string(k.examples) + ", but " + what + " holds only " +
                                       std::to_string(tiles) + " sequential windows of block_size " +
                                       std::to_string(k.block) + "; use sampling = \"random\" or at most " +
                                       std::to_string(tiles));
  return k.examples;
}

}  // namespace

std::unique_ptr<Stage> make_text(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "text");
  const std::string path = resolve_path(ctx.base_dir, cfg.get_string("path"));
  const bool bytes = cfg.get_choice("vocab", {"chars", "bytes"}, "chars") == "bytes";
  const std::string split = cfg.get_choice("split", {"train", "val"}, ctx.pipeline == "test" ? "val" : "train");
  const double val_fraction = cfg.get_float("val_fraction", 0.1);
  if (!(val_fraction > 0 && val_fraction < 1))
    cfg.fail("val_fraction", "expected the share of the text held out for validation, in (0, 1), e.g. 0.1");
  const WindowKeys k = read_window_keys(cfg, ctx);
  cfg.finish();

  auto split_name = [&](int64_t n, int64_t cut) {
    return "the " + split + " split (" + (split == "train" ? "the first " : "the last ") +
           std::to_string(split == "train" ? cut : n - cut) + " of " + std::to_string(n) + " tokens)";
  };
  {
    // Streamed when its ids (one byte per token here) exceed the budget and a token is a byte of a plain file.
    auto r = std::make_unique<ByteReader>(path, "text");
    const auto n = static_cast<int64_t>(r->file_bytes());
    const auto cut = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
    const int64_t len = split == "train" ? cut : n - cut;
    if (!r->gzip() && n > 0 && static_cast<uint64_t>(len) > ctx.decoded_budget) {
      std::array<uint8_t, 256> ids{};
      std::string vocab = "{\"kind\": \"bytes\", \"size\": 256}";
      bool ascii = true;
      if (bytes) {
        for (int b = 0; b < 256; ++b) ids[static_cast<size_t>(b)] = static_cast<uint8_t>(b);
      } else {  // one pass for the characters; a byte past ASCII means UTF-8 of several bytes: decoded in memory
        std::array<bool, 128> seen{};
        std::vector<unsigned char> buf(1 << 18);
        for (size_t got; ascii && (got = r->read_some(buf.data(), buf.size())) > 0;)
          for (size_t i = 0; i < got && ascii; ++i) {
            ascii = buf[i] < 0x80;
            if (ascii) seen[buf[i]] = true;
          }
        vocab = "{\"kind\": \"chars\", \"tokens\": [";
        uint8_t rank = 0;
        for (uint32_t c = 0; c < 128; ++c)
          if (seen[c]) {
            vocab += (rank ? ", " : "") + json_string(utf8_encode(c));
            ids[c] = rank++;
          }
        vocab += "]}";
      }
      if (ascii) {
        const int64_t examples = windows(cfg, k, len, *r, split_name(n, cut));
        const uint64_t begin = split == "train" ? 0 : static_cast<uint64_t>(cut);
        return std::make_unique<StreamedTextSource>(std::move(r), begin, len, ids, std::move(vocab), k.block,
                                                    k.sampling, examples, k.seed, ctx.decoded_budget);
      }
    }
  }

  ByteReader r(path, "text");
  std::string raw;
  std::vector<char> buf(1 << 18);
  while (size_t got = r.read_some(buf.data(), buf.size())) raw.append(buf.data(), got);
  if (raw.empty()) r.fail("is empty; a text source needs text");

  std::vector<uint32_t> ids;
  std::string vocab = "{\"kind\": \"" + std::string(bytes ? "bytes" : "chars") + "\", \"tokens\": [";
  if (bytes) {
    ids.assign(reinterpret_cast<const unsigned char*>(raw.data()),
               reinterpret_cast<const unsigned char*>(raw.data()) + raw.size());
    vocab = "{\"kind\": \"bytes\", \"size\": 256}";
  } else {
    std::vector<uint32_t> cps = decode_utf8(raw, r);
    std::vector<uint32_t> chars = cps;
    std::sort(chars.begin(), chars.end());
    chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
    ids.resize(cps.size());
    for (size_t i = 0; i < cps.size(); ++i)
      ids[i] = static_cast<uint32_t>(std::lower_bound(chars.begin(), chars.end(), cps[i]) - chars.begin());
    for (size_t i = 0; i < chars.size(); ++i) vocab += (i ? ", " : "") + json_string(utf8_encode(chars[i]));
    vocab += "]}";
  }
  // prepare.py: n = len(data); train = data[:int(n*0.9)]; val = data[int(n*0.9):].
  const auto n = static_cast<int64_t>(ids.size());
  const auto cut = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));
  std::vector<uint32_t> part = split == "train" ? std::vector<uint32_t>(ids.begin(), ids.begin() + cut)
                                                : std::vector<uint32_t>(ids.begin() + cut, ids.end());
  const int64_t examples = windows(cfg, k, static_cast<int64_t>(part.size()), r, split_name(n, cut));
  return std::make_unique<TextSource>(part, std::move(vocab), raw.size(), k.block, k.sampling, examples, k.seed,
                                      ctx.decoded_budget);
}

std::unique_ptr<Stage> make_tokens(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "tokens");
  const std::string path = resolve_path(ctx.base_dir, cfg.get_string("path"));
  const int64_t vocab = cfg.get_int("vocab_size");
  if (vocab < 1 || vocab > 65536)
    cfg.fail("vocab_size",
             "expected the number of token ids, 1 to 65536 (ids are uint16), found " + std::to_string(vocab));
  const WindowKeys k = read_window_keys(cfg, ctx);
  cfg.finish();
  auto r = std::make_unique<ByteReader>(path, "tokens");
  if (r->gzip()) r->fail("is gzip-compressed; windows are read at random offsets, so decompress it first");
  const uint64_t bytes = r->file_bytes();
  if (bytes % 2 != 0)
    r->fail("holds " + std::to_string(bytes) +
            " bytes, an odd count: expected little-endian uint16 token ids (2 bytes each)");
  const auto n = static_cast<int64_t>(bytes / 2);
  const int64_t examples = windows(cfg, k, n, *r, "the file");
  return std::make_unique<TokensSource>(std::move(r), n, vocab, k.block, k.sampling, examples, k.seed,
                                        ctx.decoded_budget);
}

}  // namespace kiln::data
