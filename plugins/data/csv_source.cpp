// CSV source: one example per line, every field a number; one column is the label, the others the features.
// Streams line by line (plain or gzip). x: (features), y: () the label value.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

#include "byte_reader.hpp"
#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

std::vector<std::string_view> split(std::string_view line, char delim) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i)
    if (i == line.size() || line[i] == delim) {
      out.push_back(trim(line.substr(start, i - start)));
      start = i + 1;
    }
  return out;
}

// Reads lines through a fixed-size buffer, remembering the byte offset and number of each line.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : r_(path, "csv"), buf_(64 * 1024) {}
  ByteReader& reader() { return r_; }
  uint64_t offset() const { return offset_; }  // byte offset of the next line
  uint64_t line_no() const { return line_; }   // 1-based number of the last line returned

  void seek(uint64_t offset, uint64_t line) {
    r_.seek(offset);
    offset_ = offset;
    line_ = line;
    begin_ = end_ = 0;
  }

  bool next(std::string& line) {
    line.clear();
    bool any = false;
    for (;;) {
      if (begin_ == end_) {
        begin_ = 0;
        end_ = r_.read_some(buf_.data(), buf_.size());
        if (end_ == 0) break;
      }
      any = true;
      const char* b = buf_.data() + begin_;
      const void* nl = std::memchr(b, '\n', end_ - begin_);
      size_t n = nl ? static_cast<size_t>(static_cast<const char*>(nl) - b) : end_ - begin_;
      line.append(b, n);
      begin_ += n + (nl ? 1 : 0);
      offset_ += n + (nl ? 1 : 0);
      if (nl) break;
      if (line.size() > (64u << 20)) r_.fail("line " + std::to_string(line_ + 1) + " is longer than 64 MiB");
    }
    if (!any) return false;
    ++line_;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  }

 private:
  ByteReader r_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  uint64_t offset_ = 0, line_ = 0;
};

bool blank(const std::string& s) { return s.find_first_not_of(" \t") == std::string::npos; }

class CsvSource final : public Stage {
 public:
  // labels: one column (name or index; "" = the last), or with `named` several, each a label of its own.
  CsvSource(const std::string& path, bool header, const std::vector<std::string>& labels, bool named, char delim,
            int64_t limit)
      : in_(path), delim_(delim), named_(named) {
    std::string line;
    std::vector<std::string> names;
    while (in_.next(line) && blank(line)) {
    }
    if (blank(line)) in_.reader().fail("has no rows");
    auto first = split(line, delim_);
    columns_ = first.size();
    if (header) {
      for (auto f : first) names.emplace_back(f);
      data_offset_ = in_.offset();
      data_line_ = in_.line_no();
    }
    for (const auto& label : labels) {
      size_t col = columns_ - 1;
      auto it = std::find(names.begin(), names.end(), label);
      if (it != names.end()) {
        col = static_cast<size_t>(it - names.begin());
      } else if (!label.empty()) {
        int64_t idx = -1;
        auto [p, ec] = std::from_chars(label.data(), label.data() + label.size(), idx);
        if (ec != std::errc() || p != label.data() + label.size() || idx < 0 || idx >= static_cast<int64_t>(columns_)) {
          std::string known;
          for (auto& n : names) known += (known.empty() ? "" : ", ") + n;
          in_.reader().fail("label = \"" + label + "\" is neither a column name " +
                            (header ? "(header has: " + known + ")" : "(no header row: set header = true)") +
                            " nor a column index 0.." + std::to_string(columns_ - 1));
        }
        col = static_cast<size_t>(idx);
      }
      if (std::find(label_cols_.begin(), label_cols_.end(), col) != label_cols_.end())
        in_.reader().fail("label lists column " + std::to_string(col) + " (\"" + label + "\") twice");
      label_cols_.push_back(col);
      label_names_.push_back(header ? names[col] : label);
    }
    if (columns_ < label_cols_.size() + 1)
      in_.reader().fail("line " + std::to_string(in_.line_no()) + " has " + std::to_string(columns_) +
                        " column(s); need " + std::to_string(label_cols_.size()) +
                        " label column(s) and at least one feature");
    // One streaming pass to count the rows (memory stays bounded).
    in_.seek(data_offset_, data_line_);
    uint64_t rows = 0;
    while (in_.next(line))
      if (!blank(line)) ++rows;
    if (rows == 0) in_.reader().fail("has a header row but no data rows");
    if (limit > static_cast<int64_t>(rows))
      in_.reader().fail("limit = " + std::to_string(limit) + " but the file holds only " + std::to_string(rows) +
                        " rows");
    size_ = limit > 0 ? static_cast<uint64_t>(limit) : rows;
    reset(0);
  }

  std::string name() const override { return "csv"; }
  Shape example_shape() const override { return {static_cast<int64_t>(columns_ - label_cols_.size())}; }
  Shape label_shape() const override { return named_ ? Shape{static_cast<int64_t>(label_cols_.size())} : Shape{}; }
  std::vector<std::string> label_names() const override { return named_ ? label_names_ : std::vector<std::string>{}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }

  void reset(uint64_t) override {
    in_.seek(data_offset_, data_line_);
    pos_ = 0;
  }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    while (in_.next(line_) && blank(line_)) {
    }
    if (blank(line_))
      in_.reader().fail("ended after " + std::to_string(pos_) + " rows, expected " + std::to_string(size_) +
                        " (was it modified while reading?)");
    auto fields = split(line_, delim_);
    if (fields.size() != columns_)
      in_.reader().fail("line " + std::to_string(in_.line_no()) + ": expected " + std::to_string(columns_) +
                        " columns, found " + std::to_string(fields.size()));
    Element e;
    e.x = HostTensor(example_shape());
    e.y = HostTensor(label_shape());
    size_t j = 0;
    for (size_t c = 0; c < fields.size(); ++c) {
      double v = 0;
      auto f = fields[c];
      auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
      if (f.empty() || ec != std::errc() || p != f.data() + f.size() || !std::isfinite(v))
        in_.reader().fail("line " + std::to_string(in_.line_no()) + ", column " + std::to_string(c + 1) +
                          ": expected a finite number, found \"" + std::string(f) + "\"");
      auto l = std::find(label_cols_.begin(), label_cols_.end(), c);
      if (l != label_cols_.end())
        e.y.data[static_cast<size_t>(l - label_cols_.begin())] = static_cast<float>(v);
      else
        e.x.data[j++] = static_cast<float>(v);
    }
    ++pos_;
    ++stats_.elements;
    return e;
  }

  StageState save() const override {
    StateWriter w;
    w.tag(name(), 1);
    w.u64(pos_);
    w.u64(in_.offset());
    w.u64(in_.line_no());
    return w.take();
  }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    uint64_t pos = r.u64(), offset = r.u64(), line = r.u64();
    r.done();
    if (pos > size_)
      r.fail("saved position " + std::to_string(pos) + " is past the " + std::to_string(size_) + " rows");
    in_.seek(offset, line);
    pos_ = pos;
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  LineReader in_;
  char delim_;
  bool named_ = false;
  size_t columns_ = 0;
  std::vector<size_t> label_cols_;  // in label order
  std::vector<std::string> label_names_;
  uint64_t data_offset_ = 0, data_line_ = 0, size_ = 0, pos_ = 0;
  std::string line_;
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_csv(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "csv");
  std::string path = resolve_path(ctx.base_dir, cfg.get_string("path"));
  bool header = cfg.get_bool("header", false);
  // label = "name" or a column index (one label, the default the last column), or label = ["a", "b"]: several
  // named labels, each for the model output that names it.
  const bool named = cfg.is_list("label");
  std::vector<std::string> labels =
      named ? cfg.get_string_list("label", {}) : std::vector<std::string>{cfg.get_size_text("label", "")};
  if (named && labels.empty()) cfg.fail("label", "is an empty list; name one or more label columns");
  const std::string delim = cfg.get_string("delimiter", ",");
  const char d = delim == "\\t" || delim == "tab" ? '\t' : delim.size() == 1 ? delim[0] : '\0';
  if (d == '\0' || d == '\n' || d == '"')
    cfg.fail("delimiter", "must be one character (e.g. \",\", \";\", \"\\t\"), got \"" + delim + "\"");
  int64_t limit = cfg.get_int("limit", 0);
  if (limit < 0) cfg.fail("limit", "must be >= 0 (0 = every row), got " + std::to_string(limit));
  cfg.finish();
  return std::make_unique<CsvSource>(path, header, labels, named, d, limit);
}

}  // namespace kiln::data
