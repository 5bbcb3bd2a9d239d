// The runner of the `single` strategy: one device, one DeviceState, executors cached per (batch, mode).
// Other strategies reuse it per replica.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>

#include "kiln/executor.hpp"
#include "kiln/input_slots.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

class SingleDeviceRunner : public Runner {
 public:
  SingleDeviceRunner(const RunnerContext& ctx, int device_index);
  ~SingleDeviceRunner() override;  // waits for uploads still in flight
  SingleDeviceRunner(const SingleDeviceRunner&) = delete;
  SingleDeviceRunner& operator=(const SingleDeviceRunner&) = delete;

  // Builds the training and evaluation executors for this batch size (sizes the shared regions once).
  void prepare(int64_t batch);
  Executor& executor(int64_t batch, bool training, bool ema);
  DeviceState& state() { return state_; }

  StepResult train_step(const Element& batch, const StepScalars& s) override;
  void prefetch(const Element& next) override;
  EvalResult eval_batch(const Element& batch, bool use_ema) override;
  std::map<std::string, HostTensor> save_state() override;
  void load_state(const std::map<std::string, HostTensor>& st) override;
  std::string find_nonfinite_layer(const Element& batch, int64_t step) override;
  std::vector<DevicePlan> plan() const override { return plan_for(ctx_, 0); }
  // The tensor's buffer itself where the device's memory is host memory (the cpu backend).
  std::span<float> host_view(const std::string& name) override;

  // The memory plan of a training step (plus evaluation) at ctx.global_batch on one device.
  static std::vector<DevicePlan> plan_for(const RunnerContext& ctx, int device_index);

 private:
  RunnerContext ctx_;
  DeviceContext dctx_;
  DeviceState state_;
  std::map<std::tuple<int64_t, bool, bool>, std::unique_ptr<Executor>> execs_;

  InputSlots input_;  // after state_ and execs_: destroyed first, it waits for uploads into them
};

}  // namespace kiln
