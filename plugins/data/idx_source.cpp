// IDX source (the MNIST / Fashion-MNIST format): an images file (magic 0x00000803: unsigned bytes, 3 dims
// N x rows x cols) and a labels file (magic 0x00000801: unsigned bytes, N), plain or gzip. Streams one
// example at a time. x: (1, rows, cols) floats 0..255, y: () the label byte.
#include <array>
#include <cstdio>
#include <optional>

#include "byte_reader.hpp"
#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t read_be32(ByteReader& r, const std::string& what) {
  std::array<unsigned char, 4> b{};
  r.read_exact(b.data(), 4, what);
  return static_cast<uint32_t>(b[0]) << 24 | static_cast<uint32_t>(b[1]) << 16 | static_cast<uint32_t>(b[2]) << 8 |
         b[3];
}

void check_length(ByteReader& r, uint64_t expected, const std::string& layout) {
  uint64_t found = r.uncompressed_bytes(expected);
  if (found != expected)
    r.fail("size does not match its header: " + layout + " needs " + std::to_string(expected) + " bytes" +
           (r.gzip() ? " uncompressed" : "") + ", found " + std::to_string(found) +
           (found < expected ? " (truncated file?)" : " (trailing data)"));
}

class IdxSource final : public Stage {
 public:
  IdxSource(const std::string& images, const std::string& labels, int64_t limit)
      : images_(images, "idx"), labels_(labels, "idx") {
    uint32_t m = read_be32(images_, "the magic number");
    if (m != kImagesMagic)
      images_.fail("byte offset 0: expected IDX images magic " + hex32(kImagesMagic) +
                   " (unsigned bytes, 3 dims), found " + hex32(m) +
                   (m == kLabelsMagic ? " (a labels file: are images and labels swapped?)" : ""));
    count_ = read_be32(images_, "the image count");
    rows_ = read_be32(images_, "the row count");
    cols_ = read_be32(images_, "the column count");
    if (rows_ == 0 || cols_ == 0)
      images_.fail("header gives an empty image size " + std::to_string(rows_) + " x " + std::to_string(cols_));
    uint32_t lm = read_be32(labels_, "the magic number");
    if (lm != kLabelsMagic)
      labels_.fail("byte offset 0: expected IDX labels magic " + hex32(kLabelsMagic) +
                   " (unsigned bytes, 1 dim), found " + hex32(lm));
    uint64_t nlabels = read_be32(labels_, "the label count");
    if (nlabels != count_)
      throw DataError("idx: images and labels have different counts: " + images_.path() + " holds " +
                      std::to_string(count_) + " images, " + labels_.path() + " holds " + std::to_string(nlabels) +
                      " labels");
    check_length(
        images_, 16 + count_ * rows_ * cols_,
        "16-byte header + " + std::to_string(count_) + " x " + std::to_string(rows_) + " x " + std::to_string(cols_));
    check_length(labels_, 8 + count_, "8-byte header + " + std::to_string(count_) + " labels");
    if (count_ == 0) images_.fail("holds no examples (its header gives a count of 0)");
    if (limit > static_cast<int64_t>(count_))
      images_.fail("limit = " + std::to_string(limit) + " but the file holds only " + std::to_string(count_) +
                   " examples");
    size_ = limit > 0 ? static_cast<uint64_t>(limit) : count_;
    pixels_.resize(rows_ * cols_);
    reset(0);
  }

  std::string name() const override { return "idx"; }
  Shape example_shape() const override { return {1, static_cast<int64_t>(rows_), static_cast<int64_t>(cols_)}; }
  Shape label_shape() const override { return {}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }

  void reset(uint64_t) override { seek_to(0); }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    images_.read_exact(pixels_.data(), pixels_.size(), "image " + std::to_string(pos_));
    unsigned char label = 0;
    labels_.read_exact(&label, 1, "label " + std::to_string(pos_));
    Element e;
    e.x = HostTensor(example_shape());
    for (size_t i = 0; i < pixels_.size(); ++i) e.x.data[i] = pixels_[i];
    e.y = HostTensor(Shape{}, static_cast<float>(label));
    ++pos_;
    ++stats_.elements;
    return e;
  }

  StageState save() const override { return save_position(name(), pos_); }
  void restore(const StageState& s) override {
    seek_to(restore_position(s, name(), size_, "examples of " + images_.path()));
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  void seek_to(uint64_t pos) {
    images_.seek(16 + pos * rows_ * cols_);
    labels_.seek(8 + pos);
    pos_ = pos;
  }

  ByteReader images_, labels_;
  uint64_t count_ = 0, rows_ = 0, cols_ = 0, size_ = 0, pos_ = 0;
  std::vector<unsigned char> pixels_;
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_idx(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "idx");
  std::string images = resolve_path(ctx.base_dir, cfg.get_string("images"));
  std::string labels = resolve_path(ctx.base_dir, cfg.get_string("labels"));
  int64_t limit = cfg.get_int("limit", 0);
  if (limit < 0) cfg.fail("limit", "must be >= 0 (0 = every example), got " + std::to_string(limit));
  cfg.finish();
  return std::make_unique<IdxSource>(images, labels, limit);
}

}  // namespace kiln::data
