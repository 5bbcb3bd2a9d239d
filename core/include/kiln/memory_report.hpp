// Reports of planned memory: the per-layer table, a device's step breakdown, the up-front check `kiln train` runs,
// and `kiln plan --sweep`. The largest batch that fits and the advice when it does not need no Session and are in
// memory_fit.hpp (the Session gives that advice to its allocators), included here.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "kiln/memory_fit.hpp"
#include "kiln/model.hpp"
#include "kiln/strategy.hpp"

namespace kiln {

class Session;

struct LayerRow {
  std::string name, type;
  Shape output_shape;  // per example
  int64_t parameters = 0;
  size_t parameter_bytes = 0;
  size_t activation_bytes_per_example = 0;  // storage of the layer's forward outputs (after in-place sharing)
};

std::vector<LayerRow> layer_table(const ModelSpec& m);
std::string format_layer_table(const std::vector<LayerRow>& rows);
// `blocked` (non-empty): why the run cannot start even though the step fits the limit (the limit does not fit
// beside other Kiln jobs' reservations); the verdict then says DOES NOT FIT and gives it.
std::string format_device_plan(const DevicePlan& p, size_t limit, const std::string& blocked = "");

// The whole plan of a session whose devices are open: what `kiln plan` prints and `kiln train` refuses with.
struct PlanCheck {
  std::vector<DevicePlan> plans;
  std::vector<size_t> limits;  // per plan
  bool fits = true;            // every plan fits its limit and every limit fits beside others' reservations
  bool blocked = false;        // some limit does not fit beside other Kiln jobs' reservations (train would refuse)
  size_t worst_need = 0;       // the largest plan total that exceeds its limit (0 when everything fits)
  std::string report;          // layer table, per-device breakdown and verdict, largest batch, advice
};
PlanCheck check_plan(Session& s);

// The up-front check of `kiln train` (call after open_devices, before the strategy creates its runner):
// memory_policy "strict" throws OutOfMemory carrying check_plan's full report when the plan does not fit;
// "fit" first turns on memory savers (recomputation) and keeps them in s.model().savers if that makes it fit,
// writing what it chose to `out`; "none" checks nothing. When the plan fits, each device's planned total is
// reserved as one block (Allocator::reserve) so the planned allocations pack without block-boundary waste.
void enforce_memory_plan(Session& s, std::ostream& out);

// `kiln plan --sweep`: predicted (and, with `measure`, measured with one real training step each) peak memory
// against batch size.
struct SweepPoint {
  int64_t batch = 0;
  size_t predicted = 0;  // plan total (largest over devices)
  size_t measured = 0;   // allocator peak_in_use after one training step (0 when not measured)
  size_t limit = 0;
  bool fits = false;
  double step_seconds = 0;
};
// Powers of two times `unit` up to the largest batch that fits, that batch, and one point past it.
std::vector<int64_t> default_sweep_batches(int64_t largest_fit, int64_t unit = 1);
std::vector<SweepPoint> memory_sweep(Session& s, const std::vector<int64_t>& batches, bool measure,
                                     std::ostream* progress);
std::string sweep_csv(const std::vector<SweepPoint>& points);
std::string sweep_svg(const std::vector<SweepPoint>& points, const std::string& title);

}  // namespace kiln
