// Batch stage: stacks `size` consecutive examples into one element, x (N, ...), y (N) or (N, k). The last
// batch of an epoch may be smaller unless drop_remainder. It makes global batches only: splitting a batch
// over replicas is the data-parallel strategy's job.
#include <algorithm>
#include <optional>

#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class BatchStage final : public Stage {
 public:
  BatchStage(std::unique_ptr<Stage> up, int64_t size, bool drop) : up_(std::move(up)), size_(size), drop_(drop) {}

  std::string name() const override { return "batch"; }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  // Examples per epoch (not batches), after dropping the remainder.
  int64_t size_hint() const override {
    int64_t n = up_->size_hint();
    return n >= 0 && drop_ ? n / size_ * size_ : n;
  }

  void reset(uint64_t epoch) override { up_->reset(epoch); }

  std::optional<Element> next() override {
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
    Element b = stack_examples(ex, name());
    ++stats_.elements;
    return b;
  }

  StageState save() const override {
    StateWriter w;
    w.tag(name(), 1);
    w.blob(up_->save());
    return w.take();
  }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    up_->restore(r.blob());
    r.done();
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    up_->collect_stats(out);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  std::unique_ptr<Stage> up_;
  int64_t size_;
  bool drop_;
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
  return std::make_unique<BatchStage>(std::move(ctx.upstream), size, drop);
}

}  // namespace kiln::data
