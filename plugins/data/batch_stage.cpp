// Batch stage: stacks `size` consecutive examples into one element, x (N, ...), y (N) or (N, k). The last
// batch of an epoch may be smaller unless drop_remainder. It makes global batches only: splitting a batch
// over replicas is the data-parallel strategy's job.
//
// Over an upstream with random access and a known size, row r of the batch starting at epoch position p is
// example p + r of the upstream, written in place by upstream.fill(p + r, row): a decoded source converts its bytes
// straight into the row and shape-preserving maps transform it there, so no example is built as its own tensors.
// Only when a map's workers read ahead on threads of their own are the rows collected from next() instead.
//
// A process that uses only rows [rows_begin, rows_end) of every global batch (an MPI rank's share under
// data_parallel, StageContext) reads only those rows (through fill(), or through a reading-ahead upstream's next()
// handed just those positions). The other rows are zero (also in a batch's memory the trainer handed back). That is
// safe because this process never reads them: its replicas train on its rows alone, and the trainer's label checks and
// the checkpoint's pending batch (gathered from every rank) look at no other row. The epoch's last, smaller batch is
// split over the replicas by its own size, so it is read whole. Without random access every row is read through next()
// (the saved state does not depend on how the rows were read; see save()).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "common.hpp"
#include "ordered_reads.hpp"
#include "stages.hpp"
#include "state_version.hpp"

namespace kiln::data {
namespace {

class BatchStage final : public Stage {
 public:
  BatchStage(std::unique_ptr<Stage> up, int64_t size, bool drop, int64_t rows_begin, int64_t rows_end)
      : up_(std::move(up)), size_(size), drop_(drop), rows_begin_(rows_begin), rows_end_(std::min(rows_end, size)) {}

  std::string name() const override { return "batch"; }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  // Examples per epoch (not batches), after dropping the remainder.
  int64_t size_hint() const override {
    int64_t n = up_->size_hint();
    return n >= 0 && drop_ ? n / size_ * size_ : n;
  }

  void reset(uint64_t epoch) override {
    up_->reset(epoch);
    epoch_ = epoch;
    start_epoch(0);
    const bool share = rows_end_ > 0 && (rows_begin_ > 0 || rows_end_ < size_);
    // Unless a map's workers read ahead (then next() collects what they made), the rows are filled in place.
    by_at_ = indexed_ && (share || !upstream_reads_ahead());
    if (by_at_) read_rows_ahead();
  }

  std::optional<Element> next() override {
    if (by_at_) return next_by_at();
    std::vector<Element> ex;
    ex.reserve(static_cast<size_t>(std::min<int64_t>(size_, 4096)));
    {
      ScopedTimer t(stats_.wait_seconds);
      while (static_cast<int64_t>(ex.size()) < size_) {
        std::optional<Element> e = up_->next();
        if (!e) break;
        ex.push_back(std::move(*e));
      }
    }
    if (ex.empty() || (drop_ && static_cast<int64_t>(ex.size()) < size_)) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    pos_ += static_cast<uint64_t>(ex.size());
    Element b = stack_examples(ex, name());
    ++stats_.elements;
    return b;
  }

  // Version 2: the epoch position in examples, whether the upstream state that follows is the one at the epoch
  // start, and that state. Over a random-access upstream it is always the epoch-start state (taken at reset), so the
  // state is the same whichever rows this process reads and however it reads them: a rank's checkpoint resumes in
  // one process and the reverse. Version 1 held only the upstream's state.
  StageState save() const override {
    StateWriter w;
    if (!pos_known_) {  // restored from a version-1 state in this epoch: the position in examples is not known
      w.tag(name(), 1);
      w.blob(up_->save());
      return w.take();
    }
    w.tag(name(), 2);
    w.u64(pos_);
    w.u64(indexed_ ? 1 : 0);
    w.blob(indexed_ ? start_state_ : up_->save());
    return w.take();
  }

  void restore(const StageState& s) override {
    if (state_version(s) == 1) {
      StateReader r(s, name(), 1);
      up_->restore(r.blob());
      r.done();
      // The position in examples is not known: this epoch reads every row through next().
      by_at_ = indexed_ = false;
      pos_known_ = false;
      return;
    }
    StateReader r(s, name(), 2);
    const uint64_t pos = r.u64();
    const bool at_start = r.u64() != 0;
    up_->restore(r.blob());
    r.done();
    if (indexed_) {
      // Read from the position on through at() (every row, or this process's): the upstream goes back to the epoch
      // start, whose state save() writes.
      up_->reset(epoch_);
      start_epoch(pos);
      if (pos > static_cast<uint64_t>(epoch_size_))
        r.fail("the saved position is example " + std::to_string(pos) + ", but the epoch has " +
               std::to_string(epoch_size_) + " (has the upstream data changed?)");
      by_at_ = indexed_;
      read_rows_ahead();
      return;
    }
    pos_ = pos;
    pos_known_ = true;
    if (!at_start) return;
    // Saved over a random-access upstream, which is at the epoch start now: replay it to the position.
    for (uint64_t i = 0; i < pos; ++i)
      if (!up_->next())
        r.fail("replaying " + std::to_string(pos) + " examples ran out of data after " + std::to_string(i) +
               " (has the upstream data changed?)");
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    up_->collect_stats(out);
    out.push_back(stats_);
    out.back().name = name();
  }

  // Two are kept: the trainer holds at most the batch of its step and the one it pulled ahead.
  void recycle(Element&& e) override {
    if (e.batch > 0 && spare_.size() < 2) spare_.push_back(std::move(e));
  }

 private:
  // The upstream is at the epoch start: decide whether it has random access, and keep its state there.
  void start_epoch(uint64_t pos) {
    const int64_t n = up_->size_hint();
    indexed_ = up_->random_access() && n >= 0;
    epoch_size_ = indexed_ ? n : 0;
    start_state_ = indexed_ ? up_->save() : StageState{};
    pos_ = pos;
    pos_known_ = true;
  }

  // The positions next_by_at() will read from pos_ on, handed to the upstream so it reads them ahead with its own
  // threads (a map's workers) when it can; otherwise next_by_at() calls at() itself.
  void read_rows_ahead() {
    if (!upstream_reads_ahead()) {
      up_reads_ = false;
      return;
    }
    auto list = std::make_shared<std::vector<uint32_t>>();
    for (int64_t p = 0; p < epoch_size_; p += size_) {
      const int64_t count = std::min(size_, epoch_size_ - p);
      if (drop_ && count < size_) break;
      const bool share = rows_end_ > 0 && count == size_;
      for (int64_t r = share ? rows_begin_ : 0; r < (share ? rows_end_ : count); ++r)
        if (p + r >= static_cast<int64_t>(pos_)) list->push_back(static_cast<uint32_t>(p + r));
    }
    OrderedReads* o = epoch_size_ <= int64_t{UINT32_MAX} ? ordered_reads(*up_) : nullptr;
    up_reads_ = o && o->reads_ahead() && o->read_in_order(std::move(list), 0);
  }

  // The rows the next batch (starting at epoch position p) will fill, as a hint to the upstream (ReadHints): the
  // trainer's step runs between the two batches, while the bytes come into the cache.
  void hint_next_batch(int64_t p) {
    const int64_t count = std::min(size_, epoch_size_ - p);
    if (count <= 0 || (drop_ && count < size_)) return;
    const bool share = rows_end_ > 0 && count == size_;
    hint_.clear();
    for (int64_t r = share ? rows_begin_ : 0; r < (share ? rows_end_ : count); ++r)
      hint_.push_back(static_cast<uint64_t>(p + r));
    hint_reads(*up_, hint_);
  }

  // A batch's tensors: a recycled batch's memory where it holds as many values (true: its old values stay until the
  // rows are written), else new zeroed memory. Allocating and zeroing a batch every step cost about a third of what a
  // batch of the smallest sample costs the trainer's thread (64 x 784 floats, 200 KB).
  bool batch_tensors(Element& b, const Shape& xs, const Shape& ys) {
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (it->x.data.size() != static_cast<size_t>(xs.numel()) || it->y.data.size() != static_cast<size_t>(ys.numel()))
        continue;
      b.x.shape = xs;
      b.y.shape = ys;
      b.x.data = std::move(it->x.data);
      b.y.data = std::move(it->y.data);
      spare_.erase(it);
      return true;
    }
    b.x = HostTensor(xs);
    b.y = HostTensor(ys);
    return false;
  }

  bool upstream_reads_ahead() const {
    const auto* o = dynamic_cast<const OrderedReads*>(up_.get());
    return o && o->reads_ahead();
  }

  // Rows by position: this process's share of a full batch, or every row (the last, smaller batch; the rest of an
  // epoch resumed mid-way).
  std::optional<Element> next_by_at() {
    const auto at = static_cast<int64_t>(pos_);
    const int64_t count = std::min(size_, epoch_size_ - at);
    if (count <= 0 || (drop_ && count < size_)) return std::nullopt;
    const bool share = rows_end_ > 0 && count == size_;
    const int64_t first = share ? rows_begin_ : 0, last = share ? rows_end_ : count;
    const Shape xs = up_->example_shape(), ys = up_->label_shape();
    Element b;
    b.batch = count;
    const bool reused = batch_tensors(b, xs.with_batch(count), ys.with_batch(count));
    const auto xn = static_cast<size_t>(xs.numel()), yn = static_cast<size_t>(ys.numel());
    float* x = b.x.data.data();
    float* y = b.y.data.data();
    if (reused && (first > 0 || last < count)) {  // the rows this process does not read are zero, as in new memory
      const auto f = static_cast<size_t>(first), l = static_cast<size_t>(last), c = static_cast<size_t>(count);
      std::fill(x, x + f * xn, 0.f);
      std::fill(x + l * xn, x + c * xn, 0.f);
      std::fill(y, y + f * yn, 0.f);
      std::fill(y + l * yn, y + c * yn, 0.f);
    }
    if (!up_reads_) {  // one timer for the batch: per row, reading the clock would cost as much as a small row
      ScopedTimer t(stats_.wait_seconds);
      std::vector<uint64_t> ks(static_cast<size_t>(last - first));
      for (size_t i = 0; i < ks.size(); ++i) ks[i] = static_cast<uint64_t>(at + first) + i;
      up_->fill(ks, x + static_cast<size_t>(first) * xn, y + static_cast<size_t>(first) * yn);
      hint_next_batch(at + count);
    }
    for (int64_t r = first; r < last && up_reads_; ++r) {
      std::optional<Element> e;
      {
        ScopedTimer t(stats_.wait_seconds);
        e = up_->next();
      }
      if (!e)
        throw Error("data stage 'batch': the upstream ended before example " + std::to_string(at + r) +
                    " of the epoch it was asked to read");
      ScopedTimer t(stats_.busy_seconds);
      if (e->batch != 0 || !(e->x.shape == xs) || !(e->y.shape == ys))
        throw DataError("data stage 'batch': example " + std::to_string(at + r) + " of the epoch has shapes x " +
                        e->x.shape.str() + ", y " + e->y.shape.str() + (e->batch ? " (a batch)" : "") +
                        ", but upstream declared x " + xs.str() + ", y " + ys.str());
      std::memcpy(x + static_cast<size_t>(r) * xn, e->x.data.data(), xn * sizeof(float));
      std::memcpy(y + static_cast<size_t>(r) * yn, e->y.data.data(), yn * sizeof(float));
    }
    pos_ += static_cast<uint64_t>(count);
    ++stats_.elements;
    return b;
  }

  std::unique_ptr<Stage> up_;
  int64_t size_;
  bool drop_;
  int64_t rows_begin_, rows_end_;  // this process's rows of every full batch; rows_end_ = 0: all
  uint64_t epoch_ = 0, pos_ = 0;   // examples of the epoch delivered
  bool pos_known_ = true;          // false after restoring a version-1 state, until the next reset
  // Decided at every reset: the upstream has random access and a known size (epoch_size_); its state then.
  bool indexed_ = false;
  int64_t epoch_size_ = 0;
  StageState start_state_;
  bool by_at_ = false;          // reading by position: every row through fill() unless up_reads_, or a share of them
  bool up_reads_ = false;       // ...through the upstream's next(), which reads those positions ahead (read_in_order)
  std::vector<uint64_t> hint_;  // the next batch's rows (hint_next_batch)
  std::vector<Element> spare_;  // batches the trainer handed back (recycle)
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_batch(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "batch");
  int64_t size = cfg.get_int("size", ctx.global_batch);
  if (cfg.has("size") && ctx.global_batch > 0 && size != ctx.global_batch)
    cfg.fail("size", "is " + std::to_string(size) + " but [train] batch_size is " + std::to_string(ctx.global_batch) +
                         "; leave size out (it defaults to batch_size) or make "
                         "them equal");
  if (size < 1)
    cfg.fail("size", "must be >= 1, got " + std::to_string(size) +
                         (ctx.global_batch == 0 ? " (no [train] batch_size to default to)" : ""));
  // One batch is one tensor: refused here, naming the size, rather than failing to allocate it mid-epoch.
  const Shape xs = ctx.upstream->example_shape().with_batch(size), ys = ctx.upstream->label_shape().with_batch(size);
  if (!xs.fits() || !ys.fits()) {
    const std::string msg = "a batch of " + std::to_string(size) + " examples of shape " +
                            ctx.upstream->example_shape().str() +
                            " is more than the largest tensor Kiln holds (2^48 bytes = 256 TiB)";
    if (cfg.has("size")) cfg.fail("size", msg + "; lower size");
    throw ConfigError("[train] batch_size = " + std::to_string(size) + ": " + msg + "; lower [train] batch_size");
  }
  bool drop = cfg.get_bool("drop_remainder", false);
  cfg.finish();
  if (ctx.rows_end > 0 && (ctx.rows_begin < 0 || ctx.rows_begin >= ctx.rows_end))
    throw Error("data stage 'batch': rows " + std::to_string(ctx.rows_begin) + ".." + std::to_string(ctx.rows_end) +
                " of every batch asked for; expected 0 <= rows_begin < rows_end");
  return std::make_unique<BatchStage>(std::move(ctx.upstream), size, drop, ctx.rows_begin, ctx.rows_end);
}

}  // namespace kiln::data
