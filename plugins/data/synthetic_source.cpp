// Synthetic source: a learnable classification set generated from a seed. Example i has label
// hash(seed, i) % classes and features class_mean[label] + noise * N(0, 1), every value a pure function of
// (seed, i), so any position can be produced directly: the source has random access (at(k) is example k, from any
// thread). `latency_ms` sleeps per example to model a slow disk.
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include "common.hpp"
#include "stages.hpp"

namespace kiln::data {
namespace {

class SyntheticSource final : public Stage {
 public:
  SyntheticSource(Shape shape, int64_t classes, int64_t examples, uint64_t seed, double latency_ms, double noise)
      : shape_(std::move(shape)),
        classes_(classes),
        examples_(examples),
        seed_(seed),
        latency_ms_(latency_ms),
        noise_(static_cast<float>(noise)) {
    const auto n = static_cast<size_t>(shape_.numel());
    means_.resize(static_cast<size_t>(classes_) * n);
    for (int64_t c = 0; c < classes_; ++c) {
      CounterRng rng(hash_key(seed_, 0x6d65616e /* "mean" */, static_cast<uint64_t>(c)));
      for (size_t j = 0; j < n; ++j) means_[static_cast<size_t>(c) * n + j] = static_cast<float>(rng.uniform() * 2 - 1);
    }
  }

  std::string name() const override { return "synthetic"; }
  Shape example_shape() const override { return shape_; }
  Shape label_shape() const override { return {}; }
  int64_t size_hint() const override { return examples_; }
  void reset(uint64_t) override { pos_ = 0; }
  bool random_access() const override { return true; }

  std::optional<Element> next() override {
    if (pos_ >= examples_) return std::nullopt;
    double busy = 0;
    Element e;
    {
      ScopedTimer t(busy);
      e = make(static_cast<uint64_t>(pos_));
    }
    ++pos_;
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.busy_seconds += busy;
    ++stats_.elements;
    return e;
  }

  Element at(uint64_t k) override {
    if (k >= static_cast<uint64_t>(examples_))
      throw Error("synthetic: example " + std::to_string(k) + " asked for, but the source has " +
                  std::to_string(examples_));
    double busy = 0;
    Element e;
    {
      ScopedTimer t(busy);
      e = make(k);
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.busy_seconds += busy;
    ++stats_.elements;
    return e;
  }

  StageState save() const override { return save_position(name(), static_cast<uint64_t>(pos_)); }
  void restore(const StageState& s) override {
    pos_ = static_cast<int64_t>(restore_position(s, name(), static_cast<uint64_t>(examples_), "examples"));
  }

  void collect_stats(std::vector<StageStats>& out) const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    out.push_back(stats_);
    out.back().name = name();
  }

 private:
  Element make(uint64_t i) const {
    if (latency_ms_ > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(latency_ms_));
    const auto label =
        static_cast<int64_t>(hash_key(seed_, 0x6c6162656c /* "label" */, i) % static_cast<uint64_t>(classes_));
    Element e;
    e.x = HostTensor(shape_);
    const size_t n = e.x.data.size();
    const float* mean = means_.data() + static_cast<size_t>(label) * n;
    CounterRng rng(hash_key(seed_, 0x78 /* "x" */, i));
    for (size_t j = 0; j < n; ++j) e.x.data[j] = mean[j] + noise_ * rng.normal();
    e.y = HostTensor(Shape{}, static_cast<float>(label));
    return e;
  }

  Shape shape_;
  int64_t classes_, examples_;
  uint64_t seed_;
  double latency_ms_;
  float noise_;
  std::vector<float> means_;  // (classes, numel)
  int64_t pos_ = 0;
  mutable std::mutex stats_mu_;  // at() may run on several threads at once
  StageStats stats_;
};

}  // namespace

std::unique_ptr<Stage> make_synthetic(const ConfigNode& cfg, StageContext ctx) {
  require_source(cfg, ctx, "synthetic");
  std::vector<int64_t> dims = cfg.get_int_list("shape");
  if (dims.empty()) cfg.fail("shape", "must list at least one dimension, e.g. shape = [1, 28, 28]");
  for (auto d : dims)
    if (d <= 0) cfg.fail("shape", "dimensions must be positive, got " + std::to_string(d));
  int64_t classes = cfg.get_int("classes", 10);
  if (classes < 1) cfg.fail("classes", "must be >= 1, got " + std::to_string(classes));
  int64_t examples = cfg.get_int("examples");
  if (examples < 1) cfg.fail("examples", "must be >= 1, got " + std::to_string(examples));
  auto seed = static_cast<uint64_t>(cfg.get_int("seed", static_cast<int64_t>(ctx.seed)));
  double latency = cfg.get_float("latency_ms", 0.0);
  if (latency < 0) cfg.fail("latency_ms", "must be >= 0, got " + std::to_string(latency));
  double noise = cfg.get_float("noise", 1.0);
  if (noise < 0) cfg.fail("noise", "must be >= 0, got " + std::to_string(noise));
  cfg.finish();
  return std::make_unique<SyntheticSource>(Shape(std::move(dims)), classes, examples, seed, latency, noise);
}

}  // namespace kiln::data
