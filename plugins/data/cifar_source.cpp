// CIFAR-10 binary source: files of records of 1 label byte (0..9) + 3072 pixel bytes (3 x 32 x 32, channel
// first). x: (3, 32, 32) floats 0..255, y: () the label. When the records fit the decoded budget they are read into
// memory once, at the source's first read, and every epoch is served from there; otherwise one record is read at a
// time.
#include <algorithm>
#include <mutex>
#include <optional>

#include "byte_reader.hpp"
#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

constexpr uint64_t kPixels = 3 * 32 * 32;
constexpr uint64_t kRecord = 1 + kPixels;

class Cifar10Source final : public Stage {
 public:
  Cifar10Source(std::vector<std::string> files, int64_t limit, uint64_t budget) : files_(std::move(files)) {
    uint64_t total = 0;
    plain_ = true;
    for (const auto& f : files_) {
      auto r = std::make_unique<ByteReader>(f, "cifar10", &counters_.bytes);
      uint64_t bytes = r->uncompressed_bytes(0);
      if (bytes == 0 || bytes % kRecord != 0)
        r->fail("length " + std::to_string(bytes) + " bytes is not a positive multiple of the 3073-byte CIFAR-10 " +
                "record (1 label byte + 3072 pixels); " + std::to_string(bytes % kRecord) + " bytes left over after " +
                std::to_string(bytes / kRecord) + " records (truncated or not CIFAR-10?)");
      records_.push_back(bytes / kRecord);
      total += bytes / kRecord;
      plain_ = plain_ && !r->gzip();
      if (!r->gzip()) random_readers_.push_back(std::move(r));  // kept open for at()'s preads
    }
    if (!plain_) random_readers_.clear();
    if (limit > static_cast<int64_t>(total))
      throw DataError("cifar10: limit = " + std::to_string(limit) + " but the files hold only " +
                      std::to_string(total) + " records");
    size_ = limit > 0 ? static_cast<uint64_t>(limit) : total;
    record_.resize(kRecord);
    plan_ = plan_reading(size_ * kRecord, budget);
    reset(0);
  }

  std::string name() const override { return "cifar10"; }
  Shape example_shape() const override { return {3, 32, 32}; }
  Shape label_shape() const override { return {}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }
  std::string reading() const override { return plan_.phrase; }
  bool random_access() const override { return plan_.decoded || plain_; }

  void reset(uint64_t) override { seek_to(0); }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(counters_.busy_seconds);
    if (plan_.decoded) {
      decode();
      ++pos_;
      counters_.elements.fetch_add(1, std::memory_order_relaxed);
      return decoded(pos_ - 1);
    }
    while (local_ >= records_[file_]) {
      ++file_;
      local_ = 0;
      reader_.reset();
    }
    if (!reader_) reader_ = std::make_unique<ByteReader>(files_[file_], "cifar10", &counters_.bytes);
    reader_->seek(local_ * kRecord);
    reader_->read_exact(record_.data(), kRecord, "record " + std::to_string(local_));
    check_label(*reader_, record_[0], local_);
    Element e = byte_example(record_.data() + 1, example_shape(), static_cast<float>(record_[0]));
    ++local_;
    ++pos_;
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  Element at(uint64_t k) override {
    if (k >= size_)
      throw Error("cifar10: element " + std::to_string(k) + " asked, but the source gives " + std::to_string(size_) +
                  " records per epoch");
    if (!random_access()) return Stage::at(k);
    Element e;
    if (plan_.decoded) {
      decode();
      e = decoded(k);
    } else {
      uint64_t f = 0, local = k;
      while (local >= records_[f]) local -= records_[f++];
      std::vector<unsigned char> rec(kRecord);
      random_readers_[f]->read_at(local * kRecord, rec.data(), kRecord, "record " + std::to_string(local));
      check_label(*random_readers_[f], rec[0], local);
      e = byte_example(rec.data() + 1, example_shape(), static_cast<float>(rec[0]));
    }
    counters_.elements.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  StageState save() const override { return save_position(name(), pos_); }
  void restore(const StageState& s) override { seek_to(restore_position(s, name(), size_, "records")); }

  void collect_stats(std::vector<StageStats>& out) const override { counters_.report(name(), out); }

 private:
  static void check_label(const ByteReader& r, unsigned char label, uint64_t local) {
    if (label > 9)
      r.fail("record " + std::to_string(local) + " at byte offset " + std::to_string(local * kRecord) +
             ": label byte is " + std::to_string(label) + ", expected 0..9");
  }

  void seek_to(uint64_t pos) {
    uint64_t f = 0, local = pos;
    while (f + 1 < records_.size() && local >= records_[f]) local -= records_[f++];
    if (f != file_ || !reader_) reader_.reset();
    file_ = f;
    local_ = local;
    pos_ = pos;
  }

  // Reads the records into memory (as in the files: label byte, then pixels) the first time anyone asks.
  void decode() {
    std::call_once(decoded_once_, [this] {
      std::vector<unsigned char> all(size_ * kRecord);
      uint64_t done = 0;
      for (size_t f = 0; f < files_.size() && done < size_; ++f) {
        const uint64_t n = std::min(records_[f], size_ - done);
        ByteReader r(files_[f], "cifar10", &counters_.bytes);
        r.read_exact(all.data() + done * kRecord, n * kRecord, "records 0.." + std::to_string(n - 1));
        for (uint64_t i = 0; i < n; ++i) check_label(r, all[(done + i) * kRecord], i);
        done += n;
      }
      records_all_ = std::move(all);
    });
  }
  Element decoded(uint64_t k) const {
    const unsigned char* rec = records_all_.data() + k * kRecord;
    return byte_example(rec + 1, example_shape(), static_cast<float>(rec[0]));
  }

  SourceCounters counters_;
  std::vector<std::string> files_;
  std::vector<uint64_t> records_;
  bool plain_ = false;                                       // no gzip file: at() preads a record
  std::vector<std::unique_ptr<ByteReader>> random_readers_;  // one per file, when plain_
  std::unique_ptr<ByteReader> reader_;                       // the file next() reads; one open at a time
  uint64_t size_ = 0, pos_ = 0, file_ = 0, local_ = 0;
  std::vector<unsigned char> record_;
  ReadingPlan plan_;
  std::once_flag decoded_once_;
  std::vector<unsigned char> records_all_;  // decoded mode, after decode()
};

}  // namespace

std::unique_ptr<Stage> make_cifar10(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "cifar10");
  std::vector<std::string> files = cfg.get_string_list("files", {});
  if (files.empty()) cfg.fail("files", "needs at least one CIFAR-10 binary file, e.g. files = [\"data_batch_1.bin\"]");
  for (auto& f : files) f = resolve_path(ctx.base_dir, f);
  int64_t limit = cfg.get_int("limit", 0);
  if (limit < 0) cfg.fail("limit", "must be >= 0 (0 = every record), got " + std::to_string(limit));
  cfg.finish();
  return std::make_unique<Cifar10Source>(std::move(files), limit, ctx.decoded_budget);
}

}  // namespace kiln::data
