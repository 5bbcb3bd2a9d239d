// Map stage: applies a list of per-example ops. With workers > 1 it pulls a chunk of elements from upstream
// (in the calling thread) and transforms the chunk on a worker pool; output order is upstream order. Random
// ops draw from hash(seed, epoch, example index, op index), so the output depends only on the seed, never on
// the worker count or thread timing.
#include <deque>
#include <optional>

#include "map_ops.hpp"
#include "stages.hpp"
#include "worker_pool.hpp"

namespace kiln::data {
namespace {

constexpr size_t kChunkExamplesPerWorker = 64;

class MapStage final : public Stage {
 public:
  MapStage(std::string name, std::unique_ptr<Stage> up, std::vector<std::unique_ptr<MapOp>> ops, size_t workers,
           uint64_t seed)
      : name_(std::move(name)), up_(std::move(up)), ops_(std::move(ops)), workers_(workers), seed_(seed),
        pool_(workers > 1 ? workers - 1 : 0) {
    in_x_ = up_->example_shape();
    in_y_ = up_->label_shape();
  }

  std::string name() const override { return name_; }
  Shape example_shape() const override { return ops_.empty() ? in_x_ : ops_.back()->x_out; }
  Shape label_shape() const override { return ops_.empty() ? in_y_ : ops_.back()->y_out; }
  int64_t size_hint() const override { return up_->size_hint(); }

  void reset(uint64_t epoch) override {
    up_->reset(epoch);
    epoch_ = epoch;
    examples_seen_ = 0;
    ready_.clear();
  }

  std::optional<Element> next() override {
    if (ready_.empty()) fill();
    if (ready_.empty()) return std::nullopt;
    Element e = std::move(ready_.front());
    ready_.pop_front();
    ++stats_.elements;
    return e;
  }

  StageState save() const override {
    StateWriter w;
    w.tag(name(), 1);
    w.blob(up_->save());
    w.u64(examples_seen_);
    w.u64(ready_.size());
    for (const auto& e : ready_) w.element(e);
    return w.take();
  }

  void restore(const StageState& s) override {
    StateReader r(s, name(), 1);
    up_->restore(r.blob());
    examples_seen_ = r.u64();
    uint64_t n = r.u64();
    ready_.clear();
    for (uint64_t i = 0; i < n; ++i) ready_.push_back(r.element());
    r.done();
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    up_->collect_stats(out);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  // Pulls the next chunk from upstream and transforms it into ready_.
  void fill() {
    std::vector<Element> pulled;
    std::vector<uint64_t> first_index;  // example index of each pulled element's first example
    size_t examples = 0;
    const size_t want = workers_ > 1 ? kChunkExamplesPerWorker * workers_ : 1;
    {
      ScopedTimer t(stats_.wait_seconds);
      while (examples < want) {
        std::optional<Element> e = up_->next();
        if (!e) break;
        first_index.push_back(examples_seen_);
        examples_seen_ += static_cast<uint64_t>(example_count(*e));
        examples += static_cast<size_t>(example_count(*e));
        pulled.push_back(std::move(*e));
      }
    }
    if (pulled.empty()) return;
    ScopedTimer t(stats_.busy_seconds);
    // Flatten to single examples so batches are transformed in parallel too.
    std::vector<std::vector<Element>> parts;
    std::vector<bool> was_batch;
    std::vector<std::pair<size_t, size_t>> flat;  // (element, example)
    for (size_t i = 0; i < pulled.size(); ++i) {
      was_batch.push_back(pulled[i].batch > 0);
      parts.push_back(split_examples(std::move(pulled[i])));
      for (size_t j = 0; j < parts.back().size(); ++j) flat.emplace_back(i, j);
    }
    const size_t tasks = std::min(workers_, flat.size());
    pool_.run(tasks, [&](size_t t) {
      const size_t lo = flat.size() * t / tasks, hi = flat.size() * (t + 1) / tasks;
      for (size_t k = lo; k < hi; ++k) {
        auto [i, j] = flat[k];
        transform(parts[i][j], first_index[i] + j);
      }
    });
    for (size_t i = 0; i < parts.size(); ++i) {
      if (was_batch[i])
        ready_.push_back(stack_examples(parts[i], name_));
      else
        ready_.push_back(std::move(parts[i][0]));
    }
  }

  void transform(Element& e, uint64_t index) const {
    if (!(e.x.shape == in_x_) || !(e.y.shape == in_y_))
      throw DataError("data stage '" + name_ + "': example " + std::to_string(index) + " has shapes x " +
                      e.x.shape.str() + ", y " + e.y.shape.str() + " but upstream declared x " + in_x_.str() +
                      ", y " + in_y_.str());
    for (size_t k = 0; k < ops_.size(); ++k) {
      CounterRng rng(hash_key(seed_, epoch_, index, k));
      ops_[k]->apply(e, rng);
    }
  }

  std::string name_;
  std::unique_ptr<Stage> up_;
  std::vector<std::unique_ptr<MapOp>> ops_;
  size_t workers_;
  uint64_t seed_;
  Shape in_x_, in_y_;
  uint64_t epoch_ = 0, examples_seen_ = 0;
  std::deque<Element> ready_;
  StageStats stats_;
  WorkerPool pool_;  // last: its threads stop before the members they use go away
};

}  // namespace

std::unique_ptr<Stage> make_map(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "map");
  std::vector<ConfigNode> op_cfgs = cfg.table_array("ops");
  if (op_cfgs.empty()) cfg.fail("ops", "needs at least one op, e.g. ops = [{op = \"scale\", factor = 0.00392156862745098}]");
  int64_t workers = cfg.get_int("workers", 1);
  if (workers < 1 || workers > 256) cfg.fail("workers", "must be in 1..256, got " + std::to_string(workers));
  auto seed = static_cast<uint64_t>(cfg.get_int("seed", static_cast<int64_t>(ctx.seed)));
  std::vector<std::unique_ptr<MapOp>> ops;
  Shape x = ctx.upstream->example_shape(), y = ctx.upstream->label_shape();
  for (const auto& oc : op_cfgs) {
    ops.push_back(make_map_op(oc, x, y));
    x = ops.back()->x_out;
    y = ops.back()->y_out;
  }
  cfg.finish();
  return std::make_unique<MapStage>("map", std::move(ctx.upstream), std::move(ops), static_cast<size_t>(workers),
                                    seed);
}

std::unique_ptr<Stage> make_scale(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "scale");
  double factor = cfg.get_float("factor", 1.0 / 255.0);
  cfg.finish();
  std::vector<std::unique_ptr<MapOp>> ops;
  ops.push_back(make_scale_op(factor, ctx.upstream->example_shape(), ctx.upstream->label_shape()));
  return std::make_unique<MapStage>("scale", std::move(ctx.upstream), std::move(ops), 1, ctx.seed);
}

}  // namespace kiln::data
