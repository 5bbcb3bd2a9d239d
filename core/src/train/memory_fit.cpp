// What fits a device's memory limit, from a strategy and its runner context: the plan against the limits, the
// largest batch that fits, and the advice an out-of-memory error carries (kiln/memory_fit.hpp).
#include "kiln/memory_fit.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/memory_savers.hpp"

namespace kiln {

namespace {

size_t limit_for(const std::vector<size_t>& limits, const DevicePlan& p, const RunnerContext& ctx, size_t i) {
  return limits.at(std::min(device_of(p, ctx, i), limits.size() - 1));
}

// Restores the model's savers when it goes out of scope (advice plans with other savers temporarily).
class SaversGuard {
 public:
  explicit SaversGuard(ModelSpec& m) : m_(m), saved_(m.savers) {}
  ~SaversGuard() { m_.savers = saved_; }
  SaversGuard(const SaversGuard&) = delete;
  SaversGuard& operator=(const SaversGuard&) = delete;

 private:
  ModelSpec& m_;
  MemorySavers saved_;
};

}  // namespace

std::vector<size_t> device_limits(const RunnerContext& ctx) {
  std::vector<size_t> l;
  for (const auto& d : ctx.devices) l.push_back(d.allocator->limit());
  return l;
}

size_t device_of(const DevicePlan& p, const RunnerContext& ctx, size_t i) {
  for (size_t d = 0; d < ctx.devices.size(); ++d)
    if (ctx.devices[d].device && ctx.devices[d].device->info().label() == p.device) return d;
  return std::min(i, ctx.devices.empty() ? size_t{0} : ctx.devices.size() - 1);
}

std::pair<size_t, bool> plan_need(Strategy& s, const RunnerContext& ctx, const std::vector<size_t>& limits) {
  auto plans = s.plan(ctx);
  size_t need = 0;
  bool fits = true;
  for (size_t i = 0; i < plans.size(); ++i) {
    need = std::max(need, plans[i].total());
    fits = fits && plans[i].total() <= limit_for(limits, plans[i], ctx, i);
  }
  return {need, fits};
}

std::string format_bytes_both(size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(b) / 1e9);
  return format_bytes(b) + (b >= 1000000000ull ? std::string(" (") + buf + ")" : "");
}

int64_t batch_unit(Strategy& s, RunnerContext ctx, int64_t hi) {
  for (int64_t b = 1; b <= std::max<int64_t>(hi, 1) && b <= 4096; ++b) {
    ctx.global_batch = b;
    try {
      s.plan(ctx);
      return b;
    } catch (const ConfigError&) {
    }
  }
  return 0;
}

int64_t largest_fitting_batch(Strategy& s, RunnerContext ctx, const std::vector<size_t>& limits, int64_t hi) {
  auto fits = [&](int64_t b) {
    ctx.global_batch = b;
    try {
      auto plans = s.plan(ctx);
      for (size_t i = 0; i < plans.size(); ++i)
        if (plans[i].total() > limit_for(limits, plans[i], ctx, i)) return false;
      return true;
    } catch (const ConfigError&) {
      return false;  // e.g. a batch that a data-parallel strategy cannot split
    }
  };
  // Strategies that split a batch (data_parallel's replicas, model_parallel's micro-batches) accept only multiples
  // of a unit: the smallest batch that plans at all. The search runs over multiples of it.
  const int64_t unit = batch_unit(s, ctx, hi);
  if (unit == 0 || !fits(unit)) return 0;
  auto fits_k = [&](int64_t k) { return fits(k * unit); };
  int64_t lo = 1, khi = std::max<int64_t>(hi / unit, 1);
  while (fits_k(khi) && khi * unit < (int64_t{1} << 24)) lo = khi, khi *= 2;
  if (lo == khi) return lo * unit;
  while (khi - lo > 1) {
    int64_t mid = lo + (khi - lo) / 2;
    (fits_k(mid) ? lo : khi) = mid;
  }
  return lo * unit;
}

std::string oom_advice(Strategy& st, const RunnerContext& ctx, ModelSpec& m, size_t device) {
  if (ctx.devices.empty() || !ctx.optimizer) return {};
  const auto limits = device_limits(ctx);
  const size_t limit = limits.at(std::min(device, limits.size() - 1));
  std::ostringstream os;
  auto verdict = [&](size_t need, bool fits) { return format_bytes_both(need) + (fits ? ": fits" : ": does not fit"); };
  os << "what would fit in the " << format_bytes(limit) << " limit of "
     << ctx.devices.at(std::min(device, ctx.devices.size() - 1)).device->info().label() << ":\n";
  const int64_t batch = ctx.global_batch;
  {
    auto [need, fits] = plan_need(st, ctx, limits);
    os << "  - as configured the step needs " << verdict(need, fits)
       << (fits ? " (so the limit is not what failed: the device refused memory or the free space is fragmented; see "
                  "above)"
                : "")
       << "\n";
  }
  const int64_t best = largest_fitting_batch(st, ctx, limits, batch);
  if (best == 0) {
    RunnerContext one = ctx;
    one.global_batch = 1;
    os << "  - batch size: none fits; even batch 1 needs " << format_bytes_both(plan_need(st, one, limits).first)
       << "\n";
  } else {
    os << "  - batch size: the largest that fits is " << best << " ([train] batch_size = " << batch << " now)\n";
  }
  // Optimizers that keep less state per parameter, cheapest first.
  const size_t state_now = ctx.optimizer->state_tensors_per_param();
  struct Alt {
    OptimizerKind kind;
    double momentum;
    const char* toml;
  };
  const Alt alts[] = {{OptimizerKind::sgd, 0.0, "[optimizer] type = \"sgd\" (no state)"},
                      {OptimizerKind::rmsprop, 0.0, "[optimizer] type = \"rmsprop\" (1 state tensor)"},
                      {OptimizerKind::sgd, 0.9, "[optimizer] type = \"sgd\", momentum = 0.9 (1 state tensor)"}};
  for (const auto& a : alts) {
    OptimizerSpec o = *ctx.optimizer;
    o.kind = a.kind;
    o.momentum = a.momentum;
    o.nesterov = false;
    if (o.state_tensors_per_param() >= state_now) continue;
    RunnerContext c = ctx;
    c.optimizer = &o;
    auto [need, fits] = plan_need(st, c, limits);
    os << "  - optimizer: " << a.toml << " needs " << verdict(need, fits) << "\n";
  }
  {
    SaversGuard guard(m);
    if (!m.savers.inplace) {
      m.savers.inplace = true;
      auto [need, fits] = plan_need(st, ctx, limits);
      os << "  - in-place activations ([memory] inplace = true) need " << verdict(need, fits) << "\n";
    }
    if (m.savers.recompute == RecomputeMode::none) {
      m.savers.recompute = RecomputeMode::auto_;
      auto [need, fits] = plan_need(st, ctx, limits);
      auto plans = st.plan(ctx);
      os << "  - recomputation ([memory] recompute = \"auto\", or [train] memory_policy = \"fit\") needs "
         << verdict(need, fits);
      if (!fits && !plans.empty() && plans[0].total() > 0)
        os << " (activations are " << format_bytes(plans[0].activations)
           << " of it; weights, gradients and optimizer state "
           << format_bytes(plans[0].parameters + plans[0].gradients + plans[0].optimizer_state) << ")";
      os << "\n";
    }
  }
  auto [need, fits] = plan_need(st, ctx, limits);
  if (!fits)
    os << "  - a memory limit of at least " << format_bytes_both(need)
       << " (a larger [device] memory_limit, or a device with more memory)\n";
  return os.str();
}

}  // namespace kiln
