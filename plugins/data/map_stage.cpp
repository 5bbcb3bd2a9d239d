// Map stage: applies a list of per-example ops. With workers = 1 it transforms in the caller's thread. With
// workers = N > 1, N threads each take a chunk from upstream (one thread at a time, in order, so every element gets
// a sequence number) and transform it in parallel; next() returns elements in sequence order. Random ops draw from
// hash(seed, epoch, example index, op index), so the output depends only on the seed, never on the worker count
// or thread timing. save() stops the threads, so the upstream position plus the transformed-but-undelivered
// elements form an exact state.
//
// Over an upstream with random access and a known size (decided at every reset), the stage has random access
// itself: at(k) transforms upstream.at(k) as example k of the epoch (the index the streaming mode gives it too), and
// the workers call at() for their chunks in parallel, so the upstream's reading and decoding run on every worker
// rather than one at a time. Its state is then just the epoch position (format version 3); a version-2 state of the
// streaming mode is read by either mode, and a version-3 state by the streaming mode too (it replays the upstream
// to that position).
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "map_ops.hpp"
#include "ordered_reads.hpp"
#include "stages.hpp"
#include "state_version.hpp"

namespace kiln::data {
namespace {

constexpr uint64_t kChunk = 16;       // elements a worker pulls at once
constexpr uint64_t kChunksAhead = 4;  // chunks per worker that may be pulled ahead of the consumer

class MapStage final : public Stage, public OrderedReads, public ReadHints {
 public:
  MapStage(std::string name, std::unique_ptr<Stage> up, std::vector<std::unique_ptr<MapOp>> ops, size_t workers,
           uint64_t seed)
      : name_(std::move(name)),
        up_(std::move(up)),
        ops_(std::move(ops)),
        workers_(workers),
        seed_(seed),
        capacity_(workers * kChunk * kChunksAhead),
        in_x_(up_->example_shape()),
        in_y_(up_->label_shape()),
        in_place_(std::all_of(ops_.begin(), ops_.end(), [](const auto& op) { return op->in_place(); })) {}
  ~MapStage() override { stop(); }

  std::string name() const override { return name_; }
  Shape example_shape() const override { return ops_.empty() ? in_x_ : ops_.back()->x_out; }
  Shape label_shape() const override { return ops_.empty() ? in_y_ : ops_.back()->y_out; }
  int64_t size_hint() const override { return up_->size_hint(); }
  bool random_access() const override { return indexed_; }

  void reset(uint64_t epoch) override {
    stop();
    up_->reset(epoch);
    epoch_ = epoch;
    clear(0);
    choose_mode();
  }

  bool read_in_order(Positions order, uint64_t from) override {
    if (!indexed_) return false;
    stop();
    clear(0);
    order_ = std::move(order);
    next_out_ = pulled_ = claimed_ = from;
    up_done_ = from >= limit();
    return true;
  }

  // Example k of the epoch, transformed; from any thread, without moving next()'s position.
  Element at(uint64_t k) override {
    if (!indexed_) return Stage::at(k);
    if (k >= size_)
      throw Error("data stage '" + name_ + "': element " + std::to_string(k) + " asked for, but the epoch has " +
                  std::to_string(size_));
    Element e = up_->at(k);
    if (e.batch != 0)
      throw Error("data stage '" + name_ + "': random access to element " + std::to_string(k) +
                  " returned a batch; at() is for single examples");
    transform(e, k);
    return e;
  }

  // Examples written into a batch's rows: the upstream fills them and in-place ops transform them there.
  void fill(std::span<const uint64_t> ks, float* x, float* y) override {
    if (!indexed_ || !in_place_) return Stage::fill(ks, x, y);
    for (uint64_t k : ks)
      if (k >= size_)
        throw Error("data stage '" + name_ + "': element " + std::to_string(k) + " asked for, but the epoch has " +
                    std::to_string(size_));
    if (ops_.size() == 1)
      if (const auto f = ops_[0]->pure_scale())
        if (auto* s = dynamic_cast<ScaledFill*>(up_.get()); s && s->fill_scaled(ks, x, y, *f)) return;
    up_->fill(ks, x, y);
    const auto xn = static_cast<size_t>(in_x_.numel()), yn = static_cast<size_t>(in_y_.numel());
    for (size_t r = 0; r < ks.size(); ++r)
      for (size_t i = 0; i < ops_.size(); ++i) {
        CounterRng rng(hash_key(seed_, epoch_, ks[r], i));
        ops_[i]->apply_row(x + r * xn, y + r * yn, rng);
      }
  }

  // Rows this map's fill() will be asked for are the upstream's same rows.
  void will_read(std::span<const uint64_t> ks) override {
    if (indexed_ && in_place_) hint_reads(*up_, ks);
  }

  // Whether next() reads ahead on worker threads (the batch stage then reads through next(), not fill()). Ops that
  // all keep the shape cost less per example than handing it between threads: such a map's rows are filled in
  // place by the batch stage's thread, and its workers serve only its own next() (no batch stage over it).
  bool reads_ahead() const override { return indexed_ && workers_ > 1 && !in_place_; }

  std::optional<Element> next() override {
    if (workers_ == 1 && indexed_) return next_indexed_inline();
    if (workers_ == 1) return next_inline();
    if (threads_.empty() && !up_done_) start();
    std::unique_lock<std::mutex> lock(mu_);
    {
      ScopedTimer t(stats_.wait_seconds);
      ready_cv_.wait(lock, [&] {
        return ready_.count(next_out_) || (error_ && error_seq_ <= next_out_) || (up_done_ && next_out_ >= pulled_);
      });
    }
    auto it = ready_.find(next_out_);
    if (it == ready_.end()) {
      if (error_) std::rethrow_exception(error_);
      return std::nullopt;
    }
    Element e = std::move(it->second);
    ready_.erase(it);
    ++next_out_;
    ++stats_.elements;
    // Wake a worker only when one waits and a whole chunk fits: waking on every element costs context switches.
    if (waiting_ > 0 && claimed_ + kChunk <= next_out_ + capacity_) space_cv_.notify_one();
    return e;
  }

  StageState save() const override {
    const_cast<MapStage*>(this)->stop();  // restarted by the next next()
    if (error_) std::rethrow_exception(error_);
    StateWriter w;
    if (indexed_) {  // the upstream stays at the epoch start: only at() reads it
      w.tag(name(), 3);
      w.blob(up_->save());
      // Reading a downstream stage's positions (read_in_order), that stage saves where it is and hands them down
      // again when restored; this stage's own position is then the epoch start.
      w.u64(order_ ? 0 : next_out_);
      return w.take();
    }
    w.tag(name(), 2);
    w.blob(up_->save());
    w.u64(examples_seen_);
    w.u64(up_done_ ? 1 : 0);
    w.u64(pulled_ - next_out_);
    for (uint64_t s = next_out_; s < pulled_; ++s) w.element(ready_.at(s));
    return w.take();
  }

  void restore(const StageState& s) override {
    stop();
    if (state_version(s) == 3) return restore_position(s);
    StateReader r(s, name(), 2);
    if (indexed_) {  // a streaming state: the position is what was seen minus what was transformed ahead
      up_->restore(r.blob());
      uint64_t seen = r.u64();
      r.u64();
      uint64_t n = r.u64();
      for (uint64_t i = 0; i < n; ++i) r.element();
      r.done();
      if (n > seen) r.fail(std::to_string(n) + " elements ahead of " + std::to_string(seen) + " seen");
      start_at(seen - n, r);
      return;
    }
    up_->restore(r.blob());
    uint64_t seen = r.u64();
    bool done = r.u64() != 0;
    uint64_t n = r.u64();
    clear(seen);
    for (uint64_t i = 0; i < n; ++i) ready_.emplace(i, r.element());
    r.done();
    pulled_ = n;
    up_done_ = done;
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    {
      std::lock_guard<std::mutex> pull(pull_mu_);  // the upstream is only used under pull_mu_
      up_->collect_stats(out);
    }
    std::lock_guard<std::mutex> lock(mu_);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  // Elements next() delivers in random-access mode, and the epoch position of the i-th.
  uint64_t limit() const { return order_ ? order_->size() : size_; }
  uint64_t index(uint64_t i) const { return order_ ? (*order_)[i] : i; }

  void choose_mode() {
    order_.reset();
    const int64_t n = up_->size_hint();
    indexed_ = up_->random_access() && n >= 0;
    size_ = indexed_ ? static_cast<uint64_t>(n) : 0;
  }

  // A version-3 state (the epoch position of the random-access mode).
  void restore_position(const StageState& s) {
    StateReader r(s, name(), 3);
    StageState up = r.blob();
    const uint64_t pos = r.u64();
    r.done();
    up_->restore(up);
    if (indexed_) return start_at(pos, r);
    // Read by the streaming mode: the upstream was saved at the epoch start, so replay it to the position.
    clear(0);
    for (uint64_t i = 0; i < pos; ++i) {
      std::optional<Element> e = up_->next();
      if (!e)
        r.fail("replaying " + std::to_string(pos) + " elements ran out of data after " + std::to_string(i) +
               " (has the upstream data changed?)");
      examples_seen_ += static_cast<uint64_t>(example_count(*e));
    }
  }

  // Random-access mode from epoch position `pos`. The upstream goes back to the epoch start (a restored streaming
  // state may have moved it), so what save() writes for it is always the epoch start.
  void start_at(uint64_t pos, const StateReader& r) {
    if (pos > size_)
      r.fail("the saved position is element " + std::to_string(pos) + ", but the epoch has " + std::to_string(size_) +
             " (has the upstream data changed?)");
    up_->reset(epoch_);
    choose_mode();
    clear(0);
    next_out_ = pulled_ = claimed_ = pos;
    up_done_ = pos >= size_;
  }

  std::optional<Element> next_indexed_inline() {
    if (next_out_ >= limit()) return std::nullopt;
    double busy = 0;
    Element e;
    {
      ScopedTimer t(busy);
      e = at(index(next_out_));
    }
    ++next_out_;
    stats_.busy_seconds += busy;
    ++stats_.elements;
    return e;
  }

  std::optional<Element> next_inline() {
    std::optional<Element> e;
    {
      ScopedTimer t(stats_.wait_seconds);
      e = up_->next();
    }
    if (!e) return std::nullopt;
    ScopedTimer t(stats_.busy_seconds);
    const uint64_t first = examples_seen_;
    examples_seen_ += static_cast<uint64_t>(example_count(*e));
    transform_element(*e, first);
    ++stats_.elements;
    return e;
  }

  // Transforms a single example or every example of a batch; `first` is the index of its first example.
  void transform_element(Element& e, uint64_t first) const {
    if (e.batch == 0) {
      transform(e, first);
      return;
    }
    std::vector<Element> parts = split_examples(std::move(e));
    for (size_t j = 0; j < parts.size(); ++j) transform(parts[j], first + j);
    e = stack_examples(parts, name_);
  }

  void transform(Element& e, uint64_t index) const {
    if (!(e.x.shape == in_x_) || !(e.y.shape == in_y_))
      throw DataError("data stage '" + name_ + "': example " + std::to_string(index) + " has shapes x " +
                      e.x.shape.str() + ", y " + e.y.shape.str() + " but upstream declared x " + in_x_.str() + ", y " +
                      in_y_.str());
    for (size_t k = 0; k < ops_.size(); ++k) {
      CounterRng rng(hash_key(seed_, epoch_, index, k));
      ops_[k]->apply(e, rng);
    }
  }

  void clear(uint64_t examples_seen) {
    ready_.clear();
    next_out_ = pulled_ = claimed_ = 0;
    examples_seen_ = examples_seen;
    up_done_ = false;
    error_ = nullptr;
  }

  void start() {
    stop_ = false;
    claimed_ = pulled_;
    for (size_t i = 0; i < workers_; ++i) threads_.emplace_back([this] { indexed_ ? work_indexed() : work(); });
  }

  // Joins the threads; every element they pulled is transformed and in ready_ afterwards (or error_ is set).
  void stop() {
    if (threads_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  void fail(std::exception_ptr err, uint64_t seq) {  // called with mu_ held
    if (!error_ || seq < error_seq_) error_ = err, error_seq_ = seq;
    up_done_ = true;
  }

  // A worker of the random-access mode: claims the next chunk of positions, reads and transforms it through at()
  // with no lock held, and hands it to the reorder buffer. Sequence numbers are epoch positions.
  void work_indexed() {
    for (;;) {
      uint64_t seq0 = 0, count = 0;
      bool ended = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++waiting_;
        space_cv_.wait(lock, [&] { return stop_ || up_done_ || claimed_ + kChunk <= next_out_ + capacity_; });
        --waiting_;
        if (stop_ || up_done_) return;
        seq0 = pulled_;
        count = std::min<uint64_t>(kChunk, limit() - pulled_);
        pulled_ += count;
        claimed_ = pulled_;
        if (pulled_ >= limit()) up_done_ = true;
        ended = up_done_;
      }
      if (ended) {
        ready_cv_.notify_all();
        space_cv_.notify_all();
      }
      std::vector<Element> chunk;
      chunk.reserve(count);
      double busy = 0;
      for (uint64_t i = 0; i < count; ++i) {
        try {
          ScopedTimer t(busy);
          chunk.push_back(at(index(seq0 + i)));
        } catch (...) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            fail(std::current_exception(), seq0 + i);
          }
          space_cv_.notify_all();
          break;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = 0; i < chunk.size(); ++i) ready_.emplace(seq0 + i, std::move(chunk[i]));
        stats_.busy_seconds += busy;
      }
      ready_cv_.notify_all();
    }
  }

  void work() {
    for (;;) {
      {  // claim room for a chunk, so the consumer is never more than capacity_ elements behind
        std::unique_lock<std::mutex> lock(mu_);
        ++waiting_;
        space_cv_.wait(lock, [&] { return stop_ || up_done_ || claimed_ + kChunk <= next_out_ + capacity_; });
        --waiting_;
        if (stop_ || up_done_) return;
        claimed_ += kChunk;
      }
      std::vector<Element> chunk;
      std::vector<uint64_t> first_index;
      uint64_t seq0 = 0;
      bool ended = false;
      {
        std::lock_guard<std::mutex> pull(pull_mu_);
        std::exception_ptr err;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (up_done_) {  // another worker reached the end while this one waited for the upstream
            claimed_ -= kChunk;
            return;
          }
        }
        try {
          while (chunk.size() < kChunk) {
            std::optional<Element> e = up_->next();
            if (!e) break;
            chunk.push_back(std::move(*e));
          }
        } catch (...) {
          err = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu_);
        seq0 = pulled_;
        for (auto& e : chunk) {
          first_index.push_back(examples_seen_);
          examples_seen_ += static_cast<uint64_t>(example_count(e));
        }
        pulled_ += chunk.size();
        claimed_ -= kChunk - chunk.size();
        if (err) fail(err, pulled_);
        if (chunk.size() < kChunk) up_done_ = true;
        ended = up_done_;
      }
      if (ended) {  // let the consumer and the other workers see the end
        ready_cv_.notify_all();
        space_cv_.notify_all();
      }
      double busy = 0;
      for (size_t i = 0; i < chunk.size(); ++i) {
        try {
          ScopedTimer t(busy);
          transform_element(chunk[i], first_index[i]);
        } catch (...) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            fail(std::current_exception(), seq0 + i);
          }
          space_cv_.notify_all();
          chunk.resize(i);
          break;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = 0; i < chunk.size(); ++i) ready_.emplace(seq0 + i, std::move(chunk[i]));
        stats_.busy_seconds += busy;
      }
      ready_cv_.notify_all();
    }
  }

  std::string name_;
  std::unique_ptr<Stage> up_;
  std::vector<std::unique_ptr<MapOp>> ops_;
  size_t workers_;
  uint64_t seed_, capacity_;
  Shape in_x_, in_y_;
  bool in_place_;  // every op keeps the shapes: fill() transforms in the row
  uint64_t epoch_ = 0;
  bool indexed_ = false;  // random-access mode (decided at every reset): reads go through up_->at()
  uint64_t size_ = 0;     // elements of the epoch in that mode
  Positions order_;       // read_in_order's positions (sequence number i is element order_[i]); null: 0, 1, ...

  // Parallel mode. mu_ guards everything below and stats_; pull_mu_ serialises use of up_ by the workers.
  mutable std::mutex mu_, pull_mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::map<uint64_t, Element> ready_;  // transformed elements by sequence number
  uint64_t next_out_ = 0, pulled_ = 0, claimed_ = 0, examples_seen_ = 0, error_seq_ = 0, waiting_ = 0;
  bool up_done_ = false, stop_ = false;
  std::exception_ptr error_;
  StageStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace

// workers = "auto" (the default): half the host's cores, 2 to 4. The threads read and transform ahead of the trainer
// and sleep once 4 chunks each ahead, so they take the data work off the step's threads rather than adding to it. On
// the 2-core build host (loaded, load average 5) 2 workers ran the Fashion-MNIST MLP sample with random_crop and
// flip_horizontal 13-15% faster than 1 (the ops in the trainer's thread) and the CNN sample at the same speed.
static int64_t map_workers(const ConfigNode& cfg) {
  const std::string text = cfg.get_size_text("workers", "auto");
  if (text == "auto") return std::clamp<int64_t>(std::thread::hardware_concurrency() / 2, 2, 4);
  int64_t workers = 0;
  size_t used = 0;
  try {
    workers = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    cfg.fail("workers", "is \"" + text + "\": expected \"auto\" (half the cores, 2 to 4) or a number of threads");
  if (workers < 1 || workers > 256) cfg.fail("workers", "must be in 1..256, got " + std::to_string(workers));
  return workers;
}

std::unique_ptr<Stage> make_map(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "map");
  std::vector<ConfigNode> op_cfgs = cfg.table_array("ops");
  if (op_cfgs.empty())
    cfg.fail("ops", "needs at least one op, e.g. ops = [{op = \"scale\", factor = 0.00392156862745098}]");
  const int64_t workers = map_workers(cfg);
  auto seed = static_cast<uint64_t>(cfg.get_int("seed", static_cast<int64_t>(ctx.seed)));
  std::vector<std::unique_ptr<MapOp>> ops;
  Shape x = ctx.upstream->example_shape(), y = ctx.upstream->label_shape();
  for (const auto& oc : op_cfgs) {
    ops.push_back(make_map_op(oc, x, y, ctx.pipeline));
    x = ops.back()->x_out;
    y = ops.back()->y_out;
  }
  cfg.finish();
  return std::make_unique<MapStage>("map", std::move(ctx.upstream), std::move(ops), static_cast<size_t>(workers), seed);
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
