// What one device's training step is given and what it needs: the device with its allocator, the step's scalars,
// and the memory it plans. Strategies (strategy.hpp), the executor (executor.hpp) and the ops whose attributes change
// every step (OpDesc::patch) all use these; the executor and the ops need nothing else of a strategy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

class Allocator;
class Device;

// A device opened for a run, with its allocator.
struct DeviceContext {
  Device* device = nullptr;
  Allocator* allocator = nullptr;
};

struct StepScalars {
  int64_t step = 0;  // 0-based global step
  float lr = 0.f;
  // float16's dynamic loss scale (1 otherwise): losses and their gradients are multiplied by it, parameter gradients
  // divided by it again (loss_unscale) before the optimizer.
  float loss_scale = 1.f;
};

// Memory needs of one device's step, as planned before anything is allocated.
struct DevicePlan {
  std::string device;  // label
  size_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, workspace = 0, input_data = 0;
  size_t total() const { return parameters + gradients + optimizer_state + activations + workspace + input_data; }
  std::vector<std::string> notes;  // placement, copies, ...
};

}  // namespace kiln
