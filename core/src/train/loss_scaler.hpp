// float16's dynamic loss scaling on the host side (PyTorch's GradScaler, same defaults): the scale a step uses, its
// growth after a run of finite steps and its backoff after a skipped one, and how a checkpoint keeps it.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "kiln/model.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

class LossScaler {
 public:
  explicit LossScaler(const PrecisionSpec& p) : spec_(p), scale_(p.init_scale) {}
  bool active() const { return spec_.loss_scaling; }
  float scale() const { return active() ? static_cast<float>(scale_) : 1.f; }
  int64_t skipped() const { return skipped_; }
  // After a step: a skipped one (non-finite gradient) backs off and resets the run of finite steps; growth_interval
  // finite steps in a row grow the scale.
  void update(bool skipped);
  // The checkpoint's tensor (scale, finite steps in a row, skipped steps), under kTensorName.
  static constexpr const char* kTensorName = "precision/loss_scale";
  void save(std::map<std::string, HostTensor>& tensors) const;
  // Takes the scaler's tensor out of a checkpoint's tensors (the model's tensors stay). A checkpoint without one (a
  // float32 or bfloat16 run continued in float16) starts at init_scale; one this run does not use is dropped.
  void load(std::map<std::string, HostTensor>& tensors, const std::string& path);

 private:
  PrecisionSpec spec_;
  double scale_;
  int64_t finite_run_ = 0, skipped_ = 0;
};

}  // namespace kiln
