// CIFAR-10 binary source: files of records of 1 label byte (0..9) + 3072 pixel bytes (3 x 32 x 32, channel
// first), read one record at a time. x: (3, 32, 32) floats 0..255, y: () the label.
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
  Cifar10Source(std::vector<std::string> files, int64_t limit) : files_(std::move(files)) {
    uint64_t total = 0;
    for (const auto& f : files_) {
      ByteReader r(f, "cifar10");
      uint64_t bytes = r.uncompressed_bytes(0);
      if (bytes == 0 || bytes % kRecord != 0)
        r.fail("length " + std::to_string(bytes) + " bytes is not a positive multiple of the 3073-byte CIFAR-10 " +
               "record (1 label byte + 3072 pixels); " + std::to_string(bytes % kRecord) + " bytes left over after " +
               std::to_string(bytes / kRecord) + " records (truncated or not CIFAR-10?)");
      records_.push_back(bytes / kRecord);
      total += bytes / kRecord;
    }
    if (limit > static_cast<int64_t>(total))
      throw DataError("cifar10: limit = " + std::to_string(limit) + " but the files hold only " +
                      std::to_string(total) + " records");
    size_ = limit > 0 ? static_cast<uint64_t>(limit) : total;
    record_.resize(kRecord);
    reset(0);
  }

  std::string name() const override { return "cifar10"; }
  Shape example_shape() const override { return {3, 32, 32}; }
  Shape label_shape() const override { return {}; }
  int64_t size_hint() const override { return static_cast<int64_t>(size_); }

  void reset(uint64_t) override { seek_to(0); }

  std::optional<Element> next() override {
    if (pos_ >= size_) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    while (local_ >= records_[file_]) {
      ++file_;
      local_ = 0;
      reader_.reset();
    }
    if (!reader_) reader_ = std::make_unique<ByteReader>(files_[file_], "cifar10");
    reader_->seek(local_ * kRecord);
    reader_->read_exact(record_.data(), kRecord, "record " + std::to_string(local_));
    if (record_[0] > 9)
      reader_->fail("record " + std::to_string(local_) + " at byte offset " + std::to_string(local_ * kRecord) +
                    ": label byte is " + std::to_string(record_[0]) + ", expected 0..9");
    Element e;
    e.x = HostTensor(example_shape());
    for (uint64_t i = 0; i < kPixels; ++i) e.x.data[i] = record_[1 + i];
    e.y = HostTensor(Shape{}, static_cast<float>(record_[0]));
    ++local_;
    ++pos_;
    ++stats_.elements;
    return e;
  }

  StageState save() const override { return save_position(name(), pos_); }
  void restore(const StageState& s) override { seek_to(restore_position(s, name(), size_, "records")); }

  void collect_stats(std::vector<StageStats>& out) const override {
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  void seek_to(uint64_t pos) {
    uint64_t f = 0, local = pos;
    while (f + 1 < records_.size() && local >= records_[f]) local -= records_[f++];
    if (f != file_ || !reader_) reader_.reset();
    file_ = f;
    local_ = local;
    pos_ = pos;
  }

  std::vector<std::string> files_;
  std::vector<uint64_t> records_;
  std::unique_ptr<ByteReader> reader_;  // the file being read; one open at a time
  uint64_t size_ = 0, pos_ = 0, file_ = 0, local_ = 0;
  std::vector<unsigned char> record_;
  StageStats stats_;
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
  return std::make_unique<Cifar10Source>(std::move(files), limit);
}

}  // namespace kiln::data
