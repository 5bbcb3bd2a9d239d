// Shuffle stage: a buffer of `buffer` elements; each next() returns a uniformly drawn element of the buffer and
// refills from upstream. Draw k of epoch e is hash(seed, e, k), so every epoch has its own deterministic order.
// save() records only (epoch, elements emitted): restore() rewinds the upstream to the epoch start and replays
// that many draws, which rebuilds the buffer exactly without storing it (a 60000-image buffer would be 188 MB).
#include <optional>

#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class ShuffleStage final : public Stage {
 public:
  ShuffleStage(std::unique_ptr<Stage> up, size_t buffer, uint64_t seed)
      : up_(std::move(up)), cap_(buffer), seed_(seed) {
    buf_.reserve(std::min<size_t>(cap_, 1 << 16));
  }

  std::string name() const override { return "shuffle"; }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }

  void reset(uint64_t epoch) override {
    up_->reset(epoch);
    epoch_ = epoch;
    start_epoch();
  }

  std::optional<Element> next() override {
    std::optional<Element> e = draw();
    if (e) ++stats_.elements;
    return e;
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
    emitted_ = 0;
    up_done_ = false;
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
  std::vector<Element> buf_;
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
