// Shuffle stage: a buffer of `buffer` elements; each next() returns a uniformly drawn element of the buffer and
// refills from upstream. Draw k of epoch e is hash(seed, e, k), so every epoch has its own deterministic order.
// save() records only (epoch, elements emitted): restore() rewinds the upstream to the epoch start and replays
// that many draws, which rebuilds the buffer exactly without storing it (a 60000-image buffer would be 188 MB).
//
// Over an upstream with random access and a known size, the same buffer algorithm runs on indices at reset(): which
// buffer slot draw k takes depends only on (seed, epoch, k) and how full the buffer is, never on the data, so the
// epoch's order is known before any element is read. next() and at(k) then read upstream.at(order[k]) directly: the
// output is bit-identical to the buffered shuffle's, nothing is buffered, and the stage itself has random access
// (an MPI rank's batch stage reads only its rows of every batch through it). The saved state is the same
// (epoch, emitted) in both modes, so either mode restores the other's state.
#include <limits>
#include <optional>

#include "common.hpp"
#include "ordered_reads.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class ShuffleStage final : public Stage, public OrderedReads, public ReadHints {
 public:
  ShuffleStage(std::unique_ptr<Stage> up, size_t buffer, uint64_t seed)
      : up_(std::move(up)), cap_(buffer), seed_(seed) {}

  std::string name() const override { return "shuffle"; }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }
  bool random_access() const override { return indexed_; }

  void reset(uint64_t epoch) override {
    up_->reset(epoch);
    epoch_ = epoch;
    start_epoch();
  }

  std::optional<Element> next() override {
    std::optional<Element> e = indexed_ ? next_indexed() : draw();
    if (e) ++stats_.elements;
    return e;
  }

  // Positions of this stage's epoch, composed with the shuffle's order and handed on to the upstream when it reads
  // ahead itself.
  bool read_in_order(Positions list, uint64_t from) override {
    if (!indexed_) return false;
    auto composed = std::make_shared<std::vector<uint32_t>>(list->size());
    for (size_t i = 0; i < list->size(); ++i) (*composed)[i] = (*order_)[(*list)[i]];
    reads_ = std::move(composed);
    read_at_ = from;
    OrderedReads* o = ordered_reads(*up_);
    up_reads_ = o && o->read_in_order(reads_, from);
    return true;
  }

  bool reads_ahead() const override {
    const OrderedReads* o = indexed_ ? dynamic_cast<const OrderedReads*>(up_.get()) : nullptr;
    return o && o->reads_ahead();
  }

  Element at(uint64_t k) override { return up_->at(upstream_index(k)); }
  void fill(std::span<const uint64_t> ks, float* x, float* y) override {
    if (!indexed_) return Stage::fill(ks, x, y);
    std::vector<uint64_t> up(ks.size());
    for (size_t i = 0; i < ks.size(); ++i) up[i] = upstream_index(ks[i]);
    up_->fill(up, x, y);
  }

  void will_read(std::span<const uint64_t> ks) override {
    if (!indexed_) return;
    hint_.clear();
    for (uint64_t k : ks)
      if (k < order_->size()) hint_.push_back((*order_)[k]);
    hint_reads(*up_, hint_);
  }

  StageState save() const override {
    StateWriter w;
    w.tag(name(), 1);
    w.u64(epoch_);
    w.u64(emitted_);
    return w.take();
  }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    uint64_t epoch = r.u64(), emitted = r.u64();
    r.done();
    up_->reset(epoch);
    epoch_ = epoch;
    start_epoch();
    if (indexed_) {
      if (emitted > order_->size())
        r.fail("the saved position is draw " + std::to_string(emitted) + " of epoch " + std::to_string(epoch) +
               ", but the upstream has " + std::to_string(order_->size()) +
               " elements (has the upstream data changed?)");
      emitted_ = emitted;
      read_all_from(emitted);
      return;
    }
    for (uint64_t i = 0; i < emitted; ++i)
      if (!draw())
        r.fail("replaying " + std::to_string(emitted) + " draws of epoch " + std::to_string(epoch) +
               " ran out of data after " + std::to_string(i) + " (has the upstream data changed?)");
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    up_->collect_stats(out);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  void start_epoch() {
    buf_.clear();
    buf_.shrink_to_fit();
    order_.reset();
    reads_.reset();
    emitted_ = 0;
    up_done_ = false;
    const int64_t n = up_->size_hint();
    indexed_ = up_->random_access() && n >= 0 && static_cast<uint64_t>(n) <= std::numeric_limits<uint32_t>::max();
    if (!indexed_) {
      buf_.reserve(std::min<size_t>(cap_, 1 << 16));
      return;
    }
    {
      ScopedTimer t(stats_.busy_seconds);
      order_ = std::make_shared<const std::vector<uint32_t>>(draw_order(static_cast<uint32_t>(n)));
    }
    read_all_from(0);
  }

  uint64_t upstream_index(uint64_t k) const {
    if (!indexed_) throw Error("shuffle: this stage has no random access (its upstream has none)");
    if (k >= order_->size())
      throw Error("shuffle: element " + std::to_string(k) + " asked for, but the epoch has " +
                  std::to_string(order_->size()));
    return (*order_)[k];
  }

  // next() reads the epoch's order from draw `from` on: through the upstream's next() when it reads ahead itself
  // (a map's workers), else through at() one element at a time.
  void read_all_from(uint64_t from) {
    reads_.reset();
    OrderedReads* o = ordered_reads(*up_);
    up_reads_ = o && o->read_in_order(order_, from);
  }

  // The buffered shuffle of draw() on the indices 0..n-1: the same fill, draw and swap-with-last.
  std::vector<uint32_t> draw_order(uint32_t n) const {
    std::vector<uint32_t> order, buf;
    order.reserve(n);
    buf.reserve(std::min<size_t>(cap_, n));
    uint32_t filled = 0;
    for (uint64_t k = 0;; ++k) {
      while (filled < n && buf.size() < cap_) buf.push_back(filled++);
      if (buf.empty()) break;
      const size_t j = static_cast<size_t>(hash_key(seed_, epoch_, k) % buf.size());
      order.push_back(buf[j]);
      buf[j] = buf.back();
      buf.pop_back();
    }
    return order;
  }

  std::optional<Element> next_indexed() {
    ScopedTimer t(stats_.wait_seconds);
    if (reads_) {  // read_in_order's positions
      if (read_at_ >= reads_->size()) return std::nullopt;
      ++read_at_;
      return up_reads_ ? up_->next() : up_->at((*reads_)[read_at_ - 1]);
    }
    if (emitted_ >= order_->size()) return std::nullopt;
    std::optional<Element> e = up_reads_ ? up_->next() : up_->at((*order_)[emitted_]);
    ++emitted_;
    return e;
  }

  std::optional<Element> draw() {
    {
      ScopedTimer t(stats_.wait_seconds);
      while (!up_done_ && buf_.size() < cap_) {
        std::optional<Element> e = up_->next();
        if (!e) {
          up_done_ = true;
          break;
        }
        buf_.push_back(std::move(*e));
      }
    }
    if (buf_.empty()) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    const size_t j = static_cast<size_t>(hash_key(seed_, epoch_, emitted_) % buf_.size());
    Element out = std::move(buf_[j]);
    if (j + 1 != buf_.size()) buf_[j] = std::move(buf_.back());
    buf_.pop_back();
    ++emitted_;
    return out;
  }

  std::unique_ptr<Stage> up_;
  size_t cap_;
  uint64_t seed_;
  uint64_t epoch_ = 0, emitted_ = 0;
  bool up_done_ = false;
  // Random-access mode (decided at every reset): the epoch's order as upstream indices; buf_ stays empty.
  bool indexed_ = false;
  Positions order_;
  bool up_reads_ = false;  // the upstream delivers order_ (or reads_) through its next(), reading ahead
  Positions reads_;        // read_in_order's positions composed with order_; null: the whole order
  uint64_t read_at_ = 0;
  std::vector<Element> buf_;
  std::vector<uint64_t> hint_;  // will_read's positions in the upstream
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_shuffle(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "shuffle");
  int64_t buffer = cfg.get_int("buffer");
  if (buffer < 1) cfg.fail("buffer", "must be >= 1 (1 = no shuffling), got " + std::to_string(buffer));
  auto seed = static_cast<uint64_t>(cfg.get_int("seed", static_cast<int64_t>(ctx.seed)));
  cfg.finish();
  return std::make_unique<ShuffleStage>(std::move(ctx.upstream), static_cast<size_t>(buffer), seed);
}

}  // namespace kiln::data
