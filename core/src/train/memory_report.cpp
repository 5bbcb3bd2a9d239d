// `kiln plan`: the per-layer table and the step's memory before anything is allocated, the verdict, and what
// would fit instead. `kiln train` refuses with the same report.
#include "kiln/memory_report.hpp"

#include <cstdio>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/memory_savers.hpp"
#include "kiln/op_table.hpp"
#include "kiln/session.hpp"

namespace kiln {

namespace {

bool is_loss(OpKind k) { return op_desc(k).is_loss; }

const char* optimizer_name(const OptimizerSpec& o) {
  switch (o.kind) {
    case OptimizerKind::sgd:
      return o.momentum > 0 ? "sgd with momentum" : "sgd";
    case OptimizerKind::adam:
      return "adam";
    case OptimizerKind::adamw:
      return "adamw";
    case OptimizerKind::rmsprop:
      return o.momentum > 0 ? "rmsprop with momentum" : "rmsprop";
  }
  return "?";
}

// Takes each device's planned total as one block, so the planned allocations pack without block-boundary waste
// (growth mode; a no-op when the whole limit is reserved already).
void reserve_planned(Session& s) {
  RunnerContext ctx = s.runner_context();
  auto plans = s.strategy().plan(ctx);
  for (size_t i = 0; i < plans.size(); ++i)
    ctx.devices.at(device_of(plans[i], ctx, i)).allocator->reserve(plans[i].total());
}

}  // namespace

std::vector<LayerRow> layer_table(const ModelSpec& m) {
  GraphOptions o;
  o.batch = 1;
  o.training = false;
  o.apply_trainable = false;  // a frozen layer's weights are still its parameters (kiln plan's frozen line counts them)
  Graph g = build_graph(m, o);
  g.inplace = m.savers.inplace;
  Liveness live = analyze_liveness(g, PlanOptions{});
  std::map<std::string, LayerRow> rows;
  std::vector<LayerRow> out;
  for (const auto& l : g.layer_outputs) {
    LayerRow r;
    r.name = l.name;
    r.type = l.type;
    r.output_shape = g.tensor(l.out).shape.tail();
    rows[l.name] = r;
  }
  std::set<TensorId> forward_outputs;
  for (const auto& n : g.nodes())
    if (n.phase == Phase::forward && !is_loss(n.kind))
      for (auto t : n.out) forward_outputs.insert(t);
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const auto& ti = g.tensors()[t];
    if (ti.alias_of != kNoTensor || !rows.count(ti.layer)) continue;
    if (ti.role == TensorRole::parameter) {
      rows[ti.layer].parameters += ti.shape.numel();
      rows[ti.layer].parameter_bytes += ti.bytes();
    } else if (ti.role == TensorRole::activation && forward_outputs.count(static_cast<TensorId>(t)) &&
               static_cast<size_t>(live.rep[t]) == t) {
      rows[ti.layer].activation_bytes_per_example += ti.bytes();
    }
  }
  for (const auto& l : g.layer_outputs) out.push_back(rows[l.name]);
  return out;
}

std::string format_layer_table(const std::vector<LayerRow>& rows) {
  std::ostringstream os;
  os << std::left << std::setw(22) << "layer" << std::setw(12) << "type" << std::setw(20) << "output shape"
     << std::right << std::setw(14) << "parameters" << std::setw(14) << "param bytes" << std::setw(18)
     << "act. bytes/ex"
     << "\n";
  os << std::string(100, '-') << "\n";
  int64_t total = 0;
  size_t bytes = 0, act = 0;
  for (const auto& r : rows) {
    os << std::left << std::setw(22) << r.name << std::setw(12) << r.type << std::setw(20) << r.output_shape.str()
       << std::right << std::setw(14) << r.parameters << std::setw(14) << format_bytes(r.parameter_bytes)
       << std::setw(18) << format_bytes(r.activation_bytes_per_example) << "\n";
    total += r.parameters;
    bytes += r.parameter_bytes;
    act += r.activation_bytes_per_example;
  }
  os << std::string(100, '-') << "\n";
  os << std::left << std::setw(54) << "total" << std::right << std::setw(14) << total << std::setw(14)
     << format_bytes(bytes) << std::setw(18) << format_bytes(act) << "\n";
  return os.str();
}

std::string format_device_plan(const DevicePlan& p, size_t limit, const std::string& blocked) {
  std::ostringstream os;
  auto line = [&](const char* what, const std::string& b) {
    os << "  " << std::left << std::setw(18) << what << std::right << std::setw(12) << b << "\n";
  };
  os << "step memory on " << p.device << ":\n";
  line("weights", format_bytes(p.parameters));
  line("gradients", format_bytes(p.gradients));
  line("optimizer state", format_bytes(p.optimizer_state));
  line("activations", format_bytes(p.activations));
  line("workspace", format_bytes(p.workspace));
  line("input buffers", format_bytes(p.input_data));
  line("total (peak)", format_bytes_both(p.total()));
  line("limit", format_bytes_both(limit));
  if (p.total() <= limit && !blocked.empty())
    os << "  verdict: DOES NOT FIT beside the current reservations: the step fits the limit with "
       << format_bytes(limit - p.total()) << " to spare, but " << blocked << "\n";
  else if (p.total() <= limit)
    os << "  verdict: FITS with " << format_bytes(limit - p.total()) << " to spare\n";
  else
    os << "  verdict: DOES NOT FIT: needs " << format_bytes_both(p.total()) << ", " << format_bytes(p.total() - limit)
       << " over the limit\n";
  for (const auto& n : p.notes) os << "  " << n << "\n";
  return os.str();
}

namespace {
const std::vector<ReservationHolder> kNoHolders;

// The model's precision and what 16-bit storage saves: the same step planned in float32 beside it.
std::string precision_line(Session& s, const RunnerContext& ctx, const std::vector<DevicePlan>& plans) {
  ModelSpec& m = s.model();
  const std::vector<DType> types = m.compute_types();
  if (types.empty()) return "precision: float32\n";
  const PrecisionSpec saved = m.precision;
  std::vector<std::optional<DType>> overrides;
  for (auto& l : m.layers) overrides.push_back(l.precision), l.precision.reset();
  m.precision = PrecisionSpec{};
  std::vector<DevicePlan> f32;
  try {
    f32 = s.strategy().plan(ctx);
  } catch (...) {
    f32.clear();
  }
  m.precision = saved;
  for (size_t i = 0; i < m.layers.size(); ++i) m.layers[i].precision = overrides[i];
  std::ostringstream os;
  os << "precision: compute " << dtype_name(saved.compute);
  for (size_t i = 0; i < m.layers.size(); ++i)
    if (overrides[i] && *overrides[i] != saved.compute)
      os << ", layer " << m.layers[i].name << " " << dtype_name(*overrides[i]);
  os << " (parameters, their gradients and optimizer state float32"
     << (saved.loss_scaling ? "; dynamic loss scaling from " + std::to_string(static_cast<int64_t>(saved.init_scale))
                            : std::string())
     << ")\n";
  for (size_t i = 0; i < plans.size() && i < f32.size(); ++i) {
    const double a = static_cast<double>(plans[i].activations), b = static_cast<double>(f32[i].activations);
    os << "  " << plans[i].device << ": activations " << format_bytes(plans[i].activations) << " against "
       << format_bytes(f32[i].activations) << " in float32 (" << std::fixed << std::setprecision(0)
       << (b > 0 ? 100.0 * a / b : 100.0) << "%), step total " << format_bytes(plans[i].total()) << " against "
       << format_bytes(f32[i].total()) << "\n";
  }
  return os.str();
}
}  // namespace

PlanCheck check_plan(Session& s) {
  PlanCheck c;
  RunnerContext ctx = s.runner_context();
  if (ctx.devices.empty()) throw Error("check_plan: the session's devices are not open");
  c.plans = s.strategy().plan(ctx);
  const auto limits = device_limits(ctx);
  std::ostringstream os;
  ModelSpec& m = s.model();
  os << "model: " << s.run_name() << " (input " << m.input_shape.str() << ", batch " << ctx.global_batch
     << ", optimizer " << (ctx.optimizer ? optimizer_name(*ctx.optimizer) : "none") << ", " << m.savers.describe()
     << ")\n";
  os << format_layer_table(layer_table(m));
  os << precision_line(s, ctx, c.plans);
  size_t worst = 0;
  for (size_t i = 0; i < c.plans.size(); ++i) {
    const size_t di = device_of(c.plans[i], ctx, i);
    const size_t limit = limits.at(di);
    c.limits.push_back(limit);
    Device& dev = *ctx.devices[di].device;
    const auto& info = dev.info();
    // `kiln train` records an explicit limit as a reservation and refuses when it does not fit beside the others'
    // (Reservation::acquire); the plan reads them without taking one and says so.
    const bool session_device = di < s.devices().size();
    const auto& others = session_device ? s.reservations_of_others(di) : kNoHolders;
    const size_t promised = total_bytes(others), total = info.total_memory;
    const size_t remains = promised < total ? total - promised : 0;
    std::string blocked;
    if (session_device && s.explicit_limit() && limit > remains)
      blocked = "`kiln train` would refuse to reserve it: other Kiln jobs hold " + format_bytes(promised) + " of the " +
                format_bytes(total) + " of " + info.label() + ", leaving " + format_bytes(remains) +
                " (lower [device] memory_limit to at most " + format_bytes(remains) +
                ", choose another device, or wait for a holder to finish)";
    os << format_device_plan(c.plans[i], limit, blocked);
    os << "  device: " << info.label() << " (" << info.name << "), " << format_bytes(info.total_memory) << " total, "
       << format_bytes(dev.query_free_memory()) << " free now\n";
    size_t sharing = 0;  // opened devices sharing the host's memory: without a limit they split it
    for (const auto& d : s.devices()) sharing += shares_host_memory(d.device->info());
    const bool split = sharing > 1 && shares_host_memory(info);
    os << "  limit from: "
       << (s.explicit_limit()
               ? "[device] memory_limit = \"" + s.device_settings().memory_limit + "\"" +
                     (split ? " on each of " + std::to_string(sharing) + " devices sharing the host's memory"
                            : std::string())
           : split ? "an equal share of the host's memory for each of the " + std::to_string(sharing) +
                         " devices that share it, minus other Kiln jobs' reservations (no [device] memory_limit)"
                   : std::string("the device's memory minus other Kiln jobs' reservations (no [device] memory_limit)"))
       << (s.device_settings().growth
               ? ", growth on demand"
               : ", growth = false: `kiln train` claims the whole limit at start (`kiln plan` claims nothing)")
       << "\n";
    if (session_device && reservation_root().empty())
      os << "  reservations: off (KILN_RESERVATION_DIR=off)\n";
    else if (session_device)
      os << "  reservations of other Kiln jobs: " << (others.empty() ? "none" : format_bytes(promised)) << " of "
         << format_bytes(total) << ", " << format_bytes(remains) << " remain"
         << (s.explicit_limit()
                 ? "; this run's limit " + format_bytes(limit) + (blocked.empty() ? " fits beside them" : " does not")
                 : std::string())
         << (others.empty() ? "\n" : ":\n" + format_holders(others));
    if (!blocked.empty()) c.fits = false, c.blocked = true;
    if (c.plans[i].total() > limit) {
      c.fits = false;
      if (c.plans[i].total() > c.worst_need) c.worst_need = c.plans[i].total(), worst = di;
    }
  }
  const int64_t best = largest_fitting_batch(s.strategy(), ctx, limits, ctx.global_batch);
  os << "largest batch size that fits: " << best << (best == 0 ? " (not even 1)" : "") << "\n";
  if (c.worst_need > 0) os << oom_advice(s.strategy(), s.runner_context(), s.model(), worst);
  c.report = os.str();
  return c;
}

void enforce_memory_plan(Session& s, std::ostream& out) {
  const std::string policy = s.train().memory_policy;
  if (policy == "none") return;
  PlanCheck c = check_plan(s);
  if (c.fits) return reserve_planned(s);
  if (policy == "fit") {
    ModelSpec& m = s.model();
    const MemorySavers before = m.savers;
    RunnerContext ctx = s.runner_context();
    const auto limits = device_limits(ctx);
    // Candidates from the least to the most recomputation: sqrt(layers) segments first, then shorter ones.
    GraphOptions go;
    go.batch = 1;
    go.training = false;
    const int64_t layers = static_cast<int64_t>(build_graph(m, go).layer_outputs.size());
    std::vector<int64_t> everies{0};
    for (int64_t k = layers; k >= 2; --k) everies.push_back(k);
    MemorySavers best = before;
    size_t best_need = SIZE_MAX;
    if (!before.inplace) {  // exact and free of extra compute: preferred when it is enough
      m.savers.inplace = true;
      auto [need, fits] = plan_need(s.strategy(), ctx, limits);
      if (fits) best = m.savers, best_need = need;
    }
    for (size_t ki = 0; best_need == SIZE_MAX && before.recompute == RecomputeMode::none && ki < everies.size(); ++ki) {
      m.savers = before;
      m.savers.inplace = true;
      m.savers.recompute = RecomputeMode::auto_;
      m.savers.checkpoint_every = everies[ki];
      auto [need, fits] = plan_need(s.strategy(), ctx, limits);
      if (fits && need < best_need) best = m.savers, best_need = need;
    }
    m.savers = before;
    if (best_need != SIZE_MAX) {
      m.savers = best;
      out << "memory_policy = \"fit\": the plan needs " << format_bytes_both(c.worst_need) << "; turned on "
          << best.describe() << ", which needs " << format_bytes_both(best_need) << "\n";
      return reserve_planned(s);
    }
  }
  throw OutOfMemory(
      "the planned training step does not fit the memory limit; nothing was allocated" +
          std::string(policy == "fit" ? " (memory_policy = \"fit\": no recomputation makes it fit)" : "") + ".\n" +
          c.report,
      c.worst_need, MemoryStats{});
}

}  // namespace kiln
