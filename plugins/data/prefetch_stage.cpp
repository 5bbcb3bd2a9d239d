// Prefetch stage: one background thread pulls from upstream into a queue of at most `depth` elements while the
// consumer works. An exception in the thread is re-thrown by next() in the consumer. reset(), restore() and
// the destructor stop and join the thread. The copy to device memory is not done here: the trainer's runner
// copies each batch it takes (it owns the device and the allocator).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class PrefetchStage final : public Stage {
 public:
  PrefetchStage(std::unique_ptr<Stage> up, size_t depth) : up_(std::move(up)), depth_(depth) {}
  ~PrefetchStage() override { stop(); }

  std::string name() const override { return "prefetch"; }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }

  void reset(uint64_t epoch) override {
    stop();
    up_->reset(epoch);
    queue_.clear();
    ended_ = false;
    error_ = nullptr;
  }

  std::optional<Element> next() override {
    if (!thread_.joinable() && !ended_) start();
    std::unique_lock<std::mutex> lock(mu_);
    {
      ScopedTimer t(stats_.wait_seconds);
      ready_cv_.wait(lock, [&] { return !queue_.empty() || ended_; });
    }
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return std::nullopt;
    }
    Element e = std::move(queue_.front());
    queue_.pop_front();
    ++stats_.elements;
    space_cv_.notify_one();
    return e;
  }

  // Stops the thread so the upstream position and the queued elements form one consistent state.
  StageState save() const override {
    auto* self = const_cast<PrefetchStage*>(this);
    bool was_running = self->thread_.joinable();
    self->stop();
    if (error_) std::rethrow_exception(error_);
    StateWriter w;
    w.tag(name(), 1);
    w.blob(up_->save());
    w.u64(ended_ ? 1 : 0);
    w.u64(queue_.size());
    for (const auto& e : queue_) w.element(e);
    if (was_running && !ended_) self->start();
    return w.take();
  }

  void restore(const StageState& s) override {
    stop();
    StateReader r(s, name(), 1);
    up_->restore(r.blob());
    bool ended = r.u64() != 0;
    uint64_t n = r.u64();
    std::deque<Element> q;
    for (uint64_t i = 0; i < n; ++i) q.push_back(r.element());
    r.done();
    queue_ = std::move(q);
    ended_ = ended;
    error_ = nullptr;
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (thread_.joinable())
      out.insert(out.end(), upstream_stats_.begin(), upstream_stats_.end());  // snapshot taken by the thread
    else
      up_->collect_stats(out);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  void start() {
    stop_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      upstream_stats_.clear();
      up_->collect_stats(upstream_stats_);
    }
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    thread_.join();
  }

  void run() {
    auto last_snapshot = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_cv_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return;
      }
      std::optional<Element> e;
      std::exception_ptr err;
      try {
        e = up_->next();
      } catch (...) {
        err = std::current_exception();
      }
      // Refresh the stats snapshot every 20 ms and at the end: collecting them may take locks in the upstream.
      std::vector<StageStats> snap;
      const auto now = std::chrono::steady_clock::now();
      const bool refresh = !e || err || now - last_snapshot > std::chrono::milliseconds(20);
      if (refresh) {
        up_->collect_stats(snap);
        last_snapshot = now;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (refresh) upstream_stats_ = std::move(snap);
      // An element already pulled is always queued, even when stopping, so save() loses nothing.
      if (e) queue_.push_back(std::move(*e));
      if (!e || err) {
        ended_ = true;
        error_ = err;
      }
      ready_cv_.notify_all();
      if (ended_) return;
    }
  }

  std::unique_ptr<Stage> up_;
  size_t depth_;
  mutable std::mutex mu_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<Element> queue_;
  bool stop_ = false, ended_ = false;
  std::exception_ptr error_;
  std::vector<StageStats> upstream_stats_;
  StageStats stats_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Stage> make_prefetch(const ConfigNode& cfg, StageContext ctx) {
  require_upstream(cfg, ctx, "prefetch");
  int64_t depth = cfg.get_int("depth", 2);
  if (depth < 1 || depth > 1024) cfg.fail("depth", "must be in 1..1024, got " + std::to_string(depth));
  cfg.finish();
  return std::make_unique<PrefetchStage>(std::move(ctx.upstream), static_cast<size_t>(depth));
}

}  // namespace kiln::data
