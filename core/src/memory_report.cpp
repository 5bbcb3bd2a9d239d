// `kiln plan`: the per-layer table and the step's memory, before anything is allocated.
#include "kiln/memory_report.hpp"

#include <cstdio>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "kiln/error.hpp"

namespace kiln {

std::vector<LayerRow> layer_table(const ModelSpec& m) {
  GraphOptions o;
  o.batch = 1;
  o.training = false;
  Graph g = build_graph(m, o);
  std::map<std::string, LayerRow> rows;
  std::vector<LayerRow> out;
  for (const auto& l : g.layer_outputs) {
    LayerRow r;
    r.name = l.name;
    r.type = l.type;
    r.output_shape = g.tensor(l.out).shape.tail();
    rows[l.name] = r;
  }
  std::set<TensorId> seen;
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const auto& ti = g.tensors()[t];
    if (ti.alias_of != kNoTensor || !rows.count(ti.layer)) continue;
    if (ti.role == TensorRole::parameter) {
      rows[ti.layer].parameters += ti.shape.numel();
      rows[ti.layer].parameter_bytes += ti.bytes();
    } else if (ti.role == TensorRole::activation) {
      rows[ti.layer].activation_bytes_per_example += ti.bytes();
    }
  }
  for (const auto& l : g.layer_outputs) out.push_back(rows[l.name]);
  return out;
}

int64_t largest_fitting_batch(Strategy& s, RunnerContext ctx, const std::vector<size_t>& limits, int64_t hi) {
  auto fits = [&](int64_t b) {
    ctx.global_batch = b;
    try {
      auto plans = s.plan(ctx);
      for (size_t i = 0; i < plans.size(); ++i)
        if (plans[i].total() > limits.at(std::min(i, limits.size() - 1))) return false;
      return true;
    } catch (const ConfigError&) {
      return false;  // e.g. a batch that a data-parallel strategy cannot split
    }
  };
  if (!fits(1)) return 0;
  int64_t lo = 1;
  if (hi < 1) hi = 1;
  while (fits(hi) && hi < (int64_t{1} << 24)) lo = hi, hi *= 2;
  if (lo == hi) return lo;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string format_layer_table(const std::vector<LayerRow>& rows) {
  std::ostringstream os;
  os << std::left << std::setw(22) << "layer" << std::setw(12) << "type" << std::setw(20) << "output shape" << std::right
     << std::setw(14) << "parameters" << std::setw(14) << "param bytes" << std::setw(18) << "act. bytes/ex" << "\n";
  os << std::string(100, '-') << "\n";
  int64_t total = 0;
  size_t bytes = 0, act = 0;
  for (const auto& r : rows) {
    os << std::left << std::setw(22) << r.name << std::setw(12) << r.type << std::setw(20) << r.output_shape.str() << std::right
       << std::setw(14) << r.parameters << std::setw(14) << format_bytes(r.parameter_bytes) << std::setw(18)
       << format_bytes(r.activation_bytes_per_example) << "\n";
    total += r.parameters;
    bytes += r.parameter_bytes;
    act += r.activation_bytes_per_example;
  }
  os << std::string(100, '-') << "\n";
  os << std::left << std::setw(54) << "total" << std::right << std::setw(14) << total << std::setw(14) << format_bytes(bytes)
     << std::setw(18) << format_bytes(act) << "\n";
  return os.str();
}

std::string format_device_plan(const DevicePlan& p, size_t limit) {
  std::ostringstream os;
  auto line = [&](const char* what, size_t b) { os << "  " << std::left << std::setw(18) << what << std::right << std::setw(12) << format_bytes(b) << "\n"; };
  os << "step memory on " << p.device << ":\n";
  line("weights", p.parameters);
  line("gradients", p.gradients);
  line("optimizer state", p.optimizer_state);
  line("activations", p.activations);
  line("workspace", p.workspace);
  line("input buffers", p.input_data);
  line("total (peak)", p.total());
  line("limit", limit);
  if (p.total() <= limit)
    os << "  verdict: FITS with " << format_bytes(limit - p.total()) << " to spare\n";
  else
    os << "  verdict: DOES NOT FIT: " << format_bytes(p.total() - limit) << " over the limit\n";
  for (const auto& n : p.notes) os << "  " << n << "\n";
  return os.str();
}

}  // namespace kiln
