// CSV source: one example per line, every field a number; one column is the label, the others the features.
// x: (features), y: () the label value. When its values (as floats) fit the decoded budget the file is parsed once,
// at the source's first read, and every epoch is served from memory; otherwise it streams line by line (plain or
// gzip).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <mutex>
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
  LineReader(const std::string& path, std::atomic<uint64_t>* counted) : r_(path, "csv", counted), buf_(64 * 1024) {}
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
            int64_t limit, uint64_t budget)
      : in_(path, &counters_.bytes), delim_(delim), named_(named) {
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
    plan_ = plan_reading(size_ * columns_ * sizeof(float), budget);
    reset(0);
  }

  std::string name() const override { return "csv"; }
  Shape example_shape() const override { return {static_cast<int64_t>(columns_ - label_cols_.size())}; }
  Shape label_shape() const override { return named_ ? Shape{static_cast<int64_t>(label_cols_.size())} : Shape{}; }
  std::vector<std::string> label_names() const override { return named_ ? label_names_ : std::vector<std::string>{}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }
  std::string reading() const override { return plan_.phrase; }
  // Streaming, row k's place in the file is unknown until the rows before it are read.
  bool random_access() const override { return plan_.decoded; }

  void reset(uint64_t) override {
    if (!plan_.decoded) in_.seek(data_offset_, data_line_);
    pos_ = 0;
  }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(counters_.busy_seconds);
    Element e = plan_.decoded ? (decode(), decoded(pos_)) : parse_next(in_);
    ++pos_;
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  Element at(uint64_t k) override {
    if (!plan_.decoded) return Stage::at(k);
    if (k >= size_)
      throw Error("csv: element " + std::to_string(k) + " asked, but the source gives " + std::to_string(size_) +
                  " rows per epoch");
    decode();
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return decoded(k);
  }

  // (pos, byte offset and number of the next line). Decoded, the offset is unknown: kNoOffset, and a streaming
  // restore finds the row by reading the rows before it.
  StageState save() const override {
    StateWriter w;
    w.tag(name(), 1);
    w.u64(pos_);
    w.u64(plan_.decoded ? kNoOffset : in_.offset());
    w.u64(plan_.decoded ? 0 : in_.line_no());
    return w.take();
  }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    uint64_t pos = r.u64(), offset = r.u64(), line = r.u64();
    r.done();
    if (pos > size_)
      r.fail("saved position " + std::to_string(pos) + " is past the " + std::to_string(size_) + " rows");
    pos_ = pos;
    if (plan_.decoded) return;
    if (offset != kNoOffset) {
      in_.seek(offset, line);
      return;
    }
    in_.seek(data_offset_, data_line_);
    for (uint64_t i = 0; i < pos; ++i) {
      while (in_.next(line_) && blank(line_)) {
      }
      if (blank(line_))
        r.fail("the file ended after " + std::to_string(i) + " of the " + std::to_string(pos) + " rows");
    }
  }

  void collect_stats(std::vector<StageStats>& out) const override { counters_.report(name(), out); }

 private:
  static constexpr uint64_t kNoOffset = std::numeric_limits<uint64_t>::max();

  // The next non-blank row of `in` as an example; `row` (0-based) only names it in messages.
  Element parse_next(LineReader& in, uint64_t row, std::string& line) {
    while (in.next(line) && blank(line)) {
    }
    if (blank(line))
      in.reader().fail("ended after " + std::to_string(row) + " rows, expected " + std::to_string(size_) +
                       " (was it modified while reading?)");
    auto fields = split(line, delim_);
    if (fields.size() != columns_)
      in.reader().fail("line " + std::to_string(in.line_no()) + ": expected " + std::to_string(columns_) +
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
        in.reader().fail("line " + std::to_string(in.line_no()) + ", column " + std::to_string(c + 1) +
                         ": expected a finite number, found \"" + std::string(f) + "\"");
      auto l = std::find(label_cols_.begin(), label_cols_.end(), c);
      if (l != label_cols_.end())
        e.y.data[static_cast<size_t>(l - label_cols_.begin())] = static_cast<float>(v);
      else
        e.x.data[j++] = static_cast<float>(v);
    }
    return e;
  }
  Element parse_next(LineReader& in) { return parse_next(in, pos_, line_); }

  // Parses the rows into memory the first time anyone asks (next() or at(), from any thread); the file is read
  // through a reader of its own so next()'s streaming position is not disturbed.
  void decode() {
    std::call_once(decoded_once_, [this] {
      LineReader in(in_.reader().path(), &counters_.bytes);
      in.seek(data_offset_, data_line_);
      const size_t nx = static_cast<size_t>(example_shape().numel()), ny = static_cast<size_t>(label_shape().numel());
      std::vector<float> xs(size_ * nx), ys(size_ * ny);
      std::string line;
      for (uint64_t i = 0; i < size_; ++i) {
        Element e = parse_next(in, i, line);
        std::copy(e.x.data.begin(), e.x.data.end(), xs.begin() + static_cast<std::ptrdiff_t>(i * nx));
        std::copy(e.y.data.begin(), e.y.data.end(), ys.begin() + static_cast<std::ptrdiff_t>(i * ny));
      }
      xs_ = std::move(xs);
      ys_ = std::move(ys);
    });
  }
  Element decoded(uint64_t k) const {
    Element e;
    e.x = HostTensor(example_shape());
    e.y = HostTensor(label_shape());
    const size_t nx = e.x.data.size(), ny = e.y.data.size();
    std::copy_n(xs_.begin() + static_cast<std::ptrdiff_t>(k * nx), nx, e.x.data.begin());
    std::copy_n(ys_.begin() + static_cast<std::ptrdiff_t>(k * ny), ny, e.y.data.begin());
    return e;
  }

  SourceCounters counters_;  // before the reader, which counts into it
  LineReader in_;
  char delim_;
  bool named_ = false;
  size_t columns_ = 0;
  std::vector<size_t> label_cols_;  // in label order
  std::vector<std::string> label_names_;
  uint64_t data_offset_ = 0, data_line_ = 0, size_ = 0, pos_ = 0;
  std::string line_;
  ReadingPlan plan_;
  std::once_flag decoded_once_;
  std::vector<float> xs_, ys_;  // decoded mode, after decode(): every row's features, then labels
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
  return std::make_unique<CsvSource>(path, header, labels, named, d, limit, ctx.decoded_budget);
}

}  // namespace kiln::data
