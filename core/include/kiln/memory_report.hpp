// Reports of planned memory: the per-layer table, a device's step breakdown, the largest batch that fits.
#pragma once
#include <string>
#include <vector>

#include "kiln/model.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

struct LayerRow {
  std::string name, type;
  Shape output_shape;  // per example
  int64_t parameters = 0;
  size_t parameter_bytes = 0;
  size_t activation_bytes_per_example = 0;  // forward outputs of the layer
};

std::vector<LayerRow> layer_table(const ModelSpec& m);
std::string format_layer_table(const std::vector<LayerRow>& rows);
std::string format_device_plan(const DevicePlan& p, size_t limit);
// The largest global batch whose plan fits every device's limit (0 if not even 1 fits). Starts probing at `hint`.
int64_t largest_fitting_batch(Strategy& s, RunnerContext ctx, const std::vector<size_t>& limits, int64_t hint);

}  // namespace kiln
