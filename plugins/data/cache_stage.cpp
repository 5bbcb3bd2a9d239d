// Cache stage: records the upstream's epoch-0 stream once, then serves every later epoch from the cache without
// touching the upstream. kind = "memory" keeps the elements in RAM; kind = "file" writes them to `path` (see
// cache_file.hpp) and reuses a complete, valid file across runs. Whatever comes before the cache is frozen at its
// epoch-0 output: put shuffling and random augmentation after it.
// save() records the position only: if the cache is complete it seeks; if not (a memory cache in a new process,
// or a file not yet complete) restore() refills it by replaying the upstream's epoch 0 up to that position.
//
// Random access: a complete cache answers at(k) (a memory cache directly, a file cache by seeking under a lock), so a
// shuffle after it draws its epoch's order up front and reads each element where it is, instead of buffering the
// whole epoch before its first element. A memory cache over an upstream with random access and a known size has
// random access from its first epoch: slot k is filled with the upstream's epoch-0 at(k) the first time element k
// is asked for (by at() or next()), which is the element a sequential fill would record there; the cache is complete
// at the first reset() after every slot is filled. Elements stay the same in every mode.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "cache_file.hpp"
#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class CacheStage final : public Stage {
 public:
  CacheStage(std::unique_ptr<Stage> up, bool file, std::string path)
      : up_(std::move(up)), file_(file), path_(std::move(path)), x_(up_->example_shape()), y_(up_->label_shape()) {
    if (file_) open_existing();
  }

  std::string name() const override { return "cache"; }
  Shape example_shape() const override { return x_; }
  Shape label_shape() const override { return y_; }
  int64_t size_hint() const override {
    if (complete_) return static_cast<int64_t>(file_ ? reader_->examples() : memory_examples_);
    return up_->size_hint();
  }

  // Decided at every reset(), as the stages after it decide theirs.
  bool random_access() const override {
    if (complete_) return file_ ? reader_->elements() == reader_->examples() : memory_examples_ == memory_.size();
    return slots_;
  }

  Element at(uint64_t k) override {
    if (!random_access()) return Stage::at(k);
    if (k >= count())
      throw Error("cache: element " + std::to_string(k) + " asked for, but the cache holds " + std::to_string(count()));
    const auto t0 = std::chrono::steady_clock::now();
    Element e;
    double wait = 0;
    if (complete_ && file_) {
      std::lock_guard<std::mutex> lock(mu_);
      reader_->seek(k);
      e = reader_->next();
      reader_->seek(pos_);
    } else if (complete_) {
      e = memory_[k];
    } else {
      e = fill_slot(k, wait);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - wait;
    stats_.wait_seconds += wait;
    ++stats_.elements;
    return e;
  }

  // A complete memory cache copies its examples straight into the batch's rows (no copy as an Element first).
  void fill(std::span<const uint64_t> ks, float* x, float* y) override {
    if (!complete_ || file_ || !random_access()) return Stage::fill(ks, x, y);
    const auto xn = static_cast<size_t>(x_.numel()), yn = static_cast<size_t>(y_.numel());
    for (size_t r = 0; r < ks.size(); ++r) {
      if (ks[r] >= memory_.size())
        throw Error("cache: element " + std::to_string(ks[r]) + " asked for, but the cache holds " +
                    std::to_string(memory_.size()));
      const Element& e = memory_[ks[r]];
      std::memcpy(x + r * xn, e.x.data.data(), xn * sizeof(float));
      std::memcpy(y + r * yn, e.y.data.data(), yn * sizeof(float));
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.elements += ks.size();
  }

  void reset(uint64_t) override {
    pos_ = 0;
    if (!complete_ && slots_ && filled_ == memory_.size()) complete_ = true;
    if (complete_) {
      if (reader_) reader_->seek(0);
      return;
    }
    start_fill();
  }

  std::optional<Element> next() override {
    if (complete_) {
      std::lock_guard<std::mutex> lock(mu_);  // at() may be reading the file or counting at the same time
      ScopedTimer t(stats_.busy_seconds);
      if (pos_ >= count()) return std::nullopt;
      Element e = file_ ? reader_->next() : memory_[pos_];
      ++pos_;
      ++stats_.elements;
      return e;
    }
    if (slots_) {
      if (pos_ >= count()) return std::nullopt;
      return at(pos_++);
    }
    std::optional<Element> e;
    {
      ScopedTimer t(stats_.wait_seconds);
      e = up_->next();
    }
    ScopedTimer t(stats_.busy_seconds);
    if (!e) {
      finish_fill();
      return std::nullopt;
    }
    record(*e);
    ++pos_;
    ++stats_.elements;
    return e;
  }

  StageState save() const override { return save_position(name(), pos_); }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    uint64_t pos = r.u64();
    r.done();
    if (complete_ || slots_) {
      if (pos > count())
        r.fail("saved position " + std::to_string(pos) + " is past the " + std::to_string(count()) +
               " cached elements (was the cache rebuilt from other data?)");
      if (reader_) reader_->seek(pos);
      pos_ = pos;
      return;  // unfilled slots fill when they are asked for
    }
    start_fill();
    for (uint64_t i = 0; i < pos; ++i) {
      std::optional<Element> e = up_->next();
      if (!e)
        r.fail("replaying " + std::to_string(pos) + " elements to refill the cache ran out after " + std::to_string(i) +
               " (has the upstream data changed?)");
      record(*e);
      ++pos_;
    }
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    up_->collect_stats(out);
    std::lock_guard<std::mutex> lock(mu_);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  uint64_t count() const { return reader_ ? reader_->elements() : memory_.size(); }

  // Slot k of a memory cache filling through random access: the upstream's epoch-0 element k, read the first time
  // it is asked for. Several threads may ask at once; the upstream's at() runs outside the lock.
  Element fill_slot(uint64_t k, double& wait) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (have_[k]) return memory_[k];
    }
    Element e;
    {
      ScopedTimer t(wait);
      e = up_->at(k);
    }
    if (e.batch != 0)
      throw Error("cache: random access to element " + std::to_string(k) +
                  " of its upstream returned a batch; at() is for single examples");
    std::lock_guard<std::mutex> lock(mu_);
    if (!have_[k]) {
      memory_[k] = e;
      have_[k] = 1;
      ++filled_;
    }
    return e;
  }

  void open_existing() {
    std::string why;
    reader_ = CacheReader::open(path_, x_, y_, why);
    const int64_t expect = up_->size_hint();
    if (reader_ && expect >= 0 && static_cast<int64_t>(reader_->examples()) != expect) {
      why = "holds " + std::to_string(reader_->examples()) + " examples, the upstream has " + std::to_string(expect);
      reader_.reset();
    }
    complete_ = reader_ != nullptr;
    if (!complete_ && why != "no such file")
      std::fprintf(stderr, "kiln: warning: data cache %s is not usable (%s); rebuilding it from the source\n",
                   path_.c_str(), why.c_str());
  }

  // The cache always holds the upstream's epoch 0, whichever epoch is running.
  void start_fill() {
    up_->reset(0);
    pos_ = 0;
    const int64_t n = up_->size_hint();
    slots_ = !file_ && n >= 0 && up_->random_access();
    if (slots_) {  // slots already filled (an epoch cut short by steps_per_epoch) hold the same elements: kept
      if (memory_.size() != static_cast<size_t>(n) || have_.size() != static_cast<size_t>(n)) {
        memory_.assign(static_cast<size_t>(n), Element{});
        have_.assign(static_cast<size_t>(n), 0);
        filled_ = 0;
      }
      memory_examples_ = static_cast<uint64_t>(n);
      return;
    }
    memory_.clear();
    memory_examples_ = 0;
    writer_.reset();
    if (file_) writer_ = std::make_unique<CacheWriter>(path_, x_, y_);
  }

  void record(const Element& e) {
    if (file_) {
      writer_->append(e);
    } else {
      memory_.push_back(e);
      memory_examples_ += static_cast<uint64_t>(example_count(e));
    }
  }

  void finish_fill() {
    if (file_) {
      writer_->commit();
      writer_.reset();
      std::string why;
      reader_ = CacheReader::open(path_, x_, y_, why);
      if (!reader_) throw DataError("cache: the file just written, " + path_ + ", does not read back: " + why);
      reader_->seek(count());
    }
    complete_ = true;
    pos_ = count();
  }

  std::unique_ptr<Stage> up_;
  bool file_;
  std::string path_;
  Shape x_, y_;
  bool complete_ = false;
  uint64_t pos_ = 0, memory_examples_ = 0;
  std::vector<Element> memory_;
  // Filling through random access (a memory cache over an upstream with at() and a known size): memory_ has one
  // slot per example, have_[k] says whether slot k is filled, filled_ counts them. mu_ guards them and stats_
  // while at() may run on several threads, and the file reader's position in at().
  bool slots_ = false;
  std::vector<uint8_t> have_;
  uint64_t filled_ = 0;
  mutable std::mutex mu_;
  std::unique_ptr<CacheWriter> writer_;
  std::unique_ptr<CacheReader> reader_;
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_cache(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "cache");
  std::string kind = cfg.get_choice("kind", {"memory", "file"}, "memory");
  std::string path;
  if (kind == "file") {
    if (!cfg.has("path")) cfg.fail("path", "is required for kind = \"file\" (where the cache file is written)");
    path = resolve_path(ctx.base_dir, cfg.get_string("path"));
    // The cache replaces what is at `path` when it is rebuilt: only ever a Kiln cache, never a user's file.
    if (std::string problem = cache_target_problem(path); !problem.empty())
      cfg.fail("path", "'" + path + "' " + problem +
                           "; a file cache only ever replaces a Kiln cache file. Delete it if it is no longer needed, "
                           "or choose another path");
  } else if (cfg.has("path")) {
    cfg.fail("path", "is only used with kind = \"file\"; a memory cache has no path");
  }
  cfg.finish();
  return std::make_unique<CacheStage>(std::move(ctx.upstream), kind == "file", path);
}

}  // namespace kiln::data
