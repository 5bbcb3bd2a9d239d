// What watches a run's metrics between steps and epochs: early stopping ([train] early_stopping) and the divergence
// guard ([train] divergence_factor) (the trainer).
#pragma once
#include <cstdint>
#include <vector>

#include "kiln/session.hpp"

namespace kiln {

// [train] early_stopping: the best value of its metric so far and the epochs since.
class EarlyStopper {
 public:
  explicit EarlyStopper(const EarlyStopping& es) : es_(es), maximize_(es.metric == "test_accuracy") {}
  // Returns true when the run should stop.
  bool observe(double v, int64_t epoch_1) {
    if (best_epoch_ == 0 || (maximize_ ? v > best_ + es_.min_delta : v < best_ - es_.min_delta)) {
      best_ = v;
      best_epoch_ = epoch_1;
      wait_ = 0;
      return false;
    }
    return ++wait_ >= es_.patience;
  }
  double best() const { return best_; }
  int64_t best_epoch() const { return best_epoch_; }

 private:
  const EarlyStopping& es_;
  bool maximize_;
  double best_ = 0;
  int64_t best_epoch_ = 0, wait_ = 0;
};

// [train] divergence_factor: a loss that grows by orders of magnitude while staying finite. The baseline is the mean
// loss of this process's first kWindow steps; the run stops when the mean of the last kWindow steps exceeds `factor`
// times it. Every rank sees the same (global) loss, so every rank stops at the same step.
class DivergenceGuard {
 public:
  static constexpr size_t kWindow = 10;
  explicit DivergenceGuard(double factor) : factor_(factor) {}
  // Returns true when the run has diverged after a step with this loss.
  bool observe(double loss) {
    if (!(factor_ > 0)) return false;
    if (first_.size() < kWindow) {
      first_.push_back(loss);
      if (first_.size() == kWindow) baseline_ = mean(first_);
      return false;
    }
    last_.push_back(loss);
    if (last_.size() > kWindow) last_.erase(last_.begin());
    return last_.size() == kWindow && baseline_ > 0 && mean(last_) > factor_ * baseline_;
  }
  double baseline() const { return baseline_; }
  double recent() const { return mean(last_); }
  double factor() const { return factor_; }

 private:
  static double mean(const std::vector<double>& v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0 : t / static_cast<double>(v.size());
  }
  double factor_;
  double baseline_ = 0;
  std::vector<double> first_, last_;
};

}  // namespace kiln
