// IDX source (the MNIST / Fashion-MNIST format): an images file (magic 0x00000803: unsigned bytes, 3 dims
// N x rows x cols) and a labels file (magic 0x00000801: unsigned bytes, N), plain or gzip. x: (1, rows, cols) floats
// 0..255, y: () the label byte. When its bytes fit the decoded budget the source reads both files once, at its first
// read (a pipeline only built, as `kiln plan` does, pays nothing), and serves every epoch from memory; otherwise it
// streams one example at a time, inflating a gzip file again every epoch.
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <optional>

#include "byte_reader.hpp"
#include "common.hpp"
#include "ordered_reads.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
// Rows of a fill() whose bytes are fetched ahead of the one being converted.
constexpr size_t kPrefetchRows = 2;

// A decoded set's bytes, in 2 MiB-aligned memory the kernel is asked to back with huge pages (madvise; where
// transparent huge pages are off it is ordinary memory). A shuffled epoch reads its rows from anywhere in the set: on
// 4 KiB pages nearly every row of a 47 MB set missed the TLB.
class SetBytes {
 public:
  static constexpr size_t kHuge = size_t{2} << 20;
  explicit SetBytes(size_t n = 0) : n_(n) {
    if (n == 0) return;
    const size_t padded = (n + kHuge - 1) / kHuge * kHuge;
    p_.reset(static_cast<unsigned char*>(std::aligned_alloc(kHuge, padded)));
    if (!p_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p_.get(), padded, MADV_HUGEPAGE);  // advice only: its failure changes nothing but speed
#endif
  }
  unsigned char* data() { return p_.get(); }
  const unsigned char* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> p_;
  size_t n_ = 0;
};

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

class IdxSource final : public Stage, public ReadHints, public ScaledFill {
 public:
  IdxSource(const std::string& images, const std::string& labels, int64_t limit, uint64_t budget)
      : images_(images, "idx", &counters_.bytes), labels_(labels, "idx", &counters_.bytes) {
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
    plan_ = plan_reading(size_ * (rows_ * cols_ + 1), budget);
    reset(0);
  }

  std::string name() const override { return "idx"; }
  Shape example_shape() const override { return {1, static_cast<int64_t>(rows_), static_cast<int64_t>(cols_)}; }
  Shape label_shape() const override { return {}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }
  std::string reading() const override { return plan_.phrase; }
  bool random_access() const override { return plan_.decoded || (!images_.gzip() && !labels_.gzip()); }

  void reset(uint64_t) override { seek_to(0); }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(counters_.busy_seconds);
    Element e;
    if (plan_.decoded) {
      decode();
      e = decoded(pos_);
    } else {
      images_.read_exact(pixels_.data(), pixels_.size(), "image " + std::to_string(pos_));
      unsigned char label = 0;
      labels_.read_exact(&label, 1, "label " + std::to_string(pos_));
      e = byte_example(pixels_.data(), example_shape(), static_cast<float>(label));
    }
    ++pos_;
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  Element at(uint64_t k) override {
    if (k >= size_)
      throw Error("idx: element " + std::to_string(k) + " asked of " + images_.path() + ", which gives " +
                  std::to_string(size_) + " examples per epoch");
    if (!random_access()) return Stage::at(k);
    Element e;
    if (plan_.decoded) {
      decode();
      e = decoded(k);
    } else {
      const uint64_t n = rows_ * cols_;
      std::vector<unsigned char> px(n);
      unsigned char label = 0;
      images_.read_at(16 + k * n, px.data(), n, "image " + std::to_string(k));
      labels_.read_at(8 + k, &label, 1, "label " + std::to_string(k));
      e = byte_example(px.data(), example_shape(), static_cast<float>(label));
    }
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  // at() without its tensors: the pixel bytes converted straight into the batch's rows. From memory, the next
  // example's bytes are fetched while this one converts (a shuffled epoch reads them from anywhere in the set).
  void fill(std::span<const uint64_t> ks, float* x, float* y) override {
    for (uint64_t k : ks)
      if (k >= size_ || !random_access()) return Stage::fill(ks, x, y);  // at() says what is wrong
    const uint64_t n = rows_ * cols_;
    if (plan_.decoded) {
      fill_decoded(ks, x, y, nullptr);
    } else {
      std::vector<unsigned char> px(n);
      for (size_t r = 0; r < ks.size(); ++r) {
        unsigned char label = 0;
        images_.read_at(16 + ks[r] * n, px.data(), n, "image " + std::to_string(ks[r]));
        labels_.read_at(8 + ks[r], &label, 1, "label " + std::to_string(ks[r]));
        bytes_to_floats(px.data(), n, x + r * n);
        y[r] = static_cast<float>(label);
      }
    }
    counters_.elements.fetch_add(ks.size(), std::memory_order_relaxed);
  }

  // A scale map's rows: converted and scaled in one pass, from memory only (streaming, the map scales).
  bool fill_scaled(std::span<const uint64_t> ks, float* x, float* y, float factor) override {
    if (!plan_.decoded) return false;
    for (uint64_t k : ks)
      if (k >= size_) return false;  // fill() says what is wrong
    fill_decoded(ks, x, y, &factor);
    counters_.elements.fetch_add(ks.size(), std::memory_order_relaxed);
    return true;
  }

  // The next batch's bytes start coming into the cache while the trainer's step runs (its fill() then finds them
  // there): from memory only, once decoded.
  void will_read(std::span<const uint64_t> ks) override {
    if (!plan_.decoded || !decoded_.load(std::memory_order_acquire)) return;
    for (size_t r = 0; r < ks.size(); ++r)
      if (ks[r] < size_) prefetch_image(ks, r);
  }

  StageState save() const override { return save_position(name(), pos_); }
  void restore(const StageState& s) override {
    seek_to(restore_position(s, name(), size_, "examples of " + images_.path()));
  }

  void collect_stats(std::vector<StageStats>& out) const override { counters_.report(name(), out); }

 private:
  void seek_to(uint64_t pos) {
    if (!plan_.decoded) {  // decoded: nothing to seek (a gzip file would be inflated up to the position)
      images_.seek(16 + pos * rows_ * cols_);
      labels_.seek(8 + pos);
    }
    pos_ = pos;
  }

  // Reads the examples into memory the first time anyone asks (next() or at(), from any thread).
  void decode() {
    std::call_once(decoded_once_, [this] {
      images_.seek(16);
      labels_.seek(8);
      SetBytes px(size_ * rows_ * cols_);
      std::vector<unsigned char> lb(size_);
      images_.read_exact(px.data(), px.size(), "images 0.." + std::to_string(size_ - 1));
      labels_.read_exact(lb.data(), lb.size(), "labels 0.." + std::to_string(size_ - 1));
      images_all_ = std::move(px);
      labels_all_ = std::move(lb);
      decoded_.store(true, std::memory_order_release);
    });
  }
  // Decoded rows into x and y (times *factor where given); the next rows' bytes are fetched while one converts.
  void fill_decoded(std::span<const uint64_t> ks, float* x, float* y, const float* factor) {
    decode();
    const uint64_t n = rows_ * cols_;
    for (size_t r = 0; r < kPrefetchRows; ++r) prefetch_image(ks, r);
    for (size_t r = 0; r < ks.size(); ++r) {
      prefetch_image(ks, r + kPrefetchRows);
      const unsigned char* px = images_all_.data() + ks[r] * n;
      if (factor)
        bytes_to_floats_scaled(px, n, *factor, x + r * n);
      else
        bytes_to_floats(px, n, x + r * n);
      y[r] = static_cast<float>(labels_all_[ks[r]]);
    }
  }
  void prefetch_image(std::span<const uint64_t> ks, size_t r) const {
    if (r >= ks.size()) return;
    const uint64_t n = rows_ * cols_;
    const unsigned char* p = images_all_.data() + ks[r] * n;
    for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off);
    __builtin_prefetch(labels_all_.data() + ks[r]);
  }
  Element decoded(uint64_t k) const {
    return byte_example(images_all_.data() + k * rows_ * cols_, example_shape(), static_cast<float>(labels_all_[k]));
  }

  SourceCounters counters_;  // before the readers, which count into it
  ByteReader images_, labels_;
  uint64_t count_ = 0, rows_ = 0, cols_ = 0, size_ = 0, pos_ = 0;
  std::vector<unsigned char> pixels_;
  ReadingPlan plan_;
  std::once_flag decoded_once_;
  std::atomic<bool> decoded_{false};       // decode() has finished (will_read, on the batch stage's thread)
  SetBytes images_all_;                    // the decoded examples (decoded mode, after decode())
  std::vector<unsigned char> labels_all_;  // and their labels
};

}  // namespace

std::unique_ptr<Stage> make_idx(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "idx");
  std::string images = resolve_path(ctx.base_dir, cfg.get_string("images"));
  std::string labels = resolve_path(ctx.base_dir, cfg.get_string("labels"));
  int64_t limit = cfg.get_int("limit", 0);
  if (limit < 0) cfg.fail("limit", "must be >= 0 (0 = every example), got " + std::to_string(limit));
  cfg.finish();
  return std::make_unique<IdxSource>(images, labels, limit, ctx.decoded_budget);
}

}  // namespace kiln::data
