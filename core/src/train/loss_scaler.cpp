#include "loss_scaler.hpp"

#include <cmath>

#include "kiln/error.hpp"

namespace kiln {

void LossScaler::update(bool skipped) {
  if (!active()) return;
  if (skipped) {
    ++skipped_;
    finite_run_ = 0;
    scale_ *= spec_.backoff_factor;
    return;
  }
  if (++finite_run_ >= spec_.growth_interval) {
    finite_run_ = 0;
    // float32's largest power of two: the loss it multiplies must stay finite
    scale_ = std::min(scale_ * spec_.growth_factor, 1.7e38);
  }
}

void LossScaler::save(std::map<std::string, HostTensor>& tensors) const {
  if (!active()) return;
  HostTensor t(Shape{3});
  t.data = {static_cast<float>(scale_), static_cast<float>(finite_run_), static_cast<float>(skipped_)};
  tensors[kTensorName] = std::move(t);
}

void LossScaler::load(std::map<std::string, HostTensor>& tensors, const std::string& path) {
  auto it = tensors.find(kTensorName);
  if (it == tensors.end()) return;
  const HostTensor t = std::move(it->second);
  tensors.erase(it);
  if (!active()) return;
  if (t.data.size() != 3 || !(t.data[0] > 0.f) || !std::isfinite(t.data[0]) || t.data[1] < 0 || t.data[2] < 0)
    throw DataError(path + ": tensor '" + kTensorName +
                    "' should hold (scale > 0, finite steps, skipped steps), found " + std::to_string(t.data.size()) +
                    " values");
  scale_ = t.data[0];
  finite_run_ = static_cast<int64_t>(t.data[1]);
  skipped_ = static_cast<int64_t>(t.data[2]);
}

}  // namespace kiln
