// Model-parallel placement (explicit or automatic) and the per-device plan with its placement report.
#include <algorithm>
#include <iomanip>
#include <map>
#include <numeric>
#include <sstream>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "model_parallel.hpp"

namespace kiln::parallel {

namespace {

bool limit_fits(const DevicePlan& p, const DeviceContext& d) { return p.total() <= d.allocator->limit(); }

// Slot of each layer from its `device` key; a layer without one runs where its first input does.
std::vector<int> explicit_slots(const ModelSpec& m, const std::vector<int>& open_index,
                                const std::vector<DeviceContext>& open, const std::string& where) {
  std::map<std::string, int> slot_of{{"input", 0}};
  std::vector<int> out;
  for (const auto& l : m.layers) {
    int slot = slot_of.at(l.inputs.empty() ? "input" : l.inputs[0]);
    if (!l.device.empty()) {
      DeviceEntry e = parse_device_entry(l.device);
      int found = -1;
      for (size_t i = 0; i < open.size(); ++i)
        if (e.label.empty() ? static_cast<int64_t>(i) == e.index : open[i].device->info().label() == e.label)
          found = static_cast<int>(i);
      auto it = std::find(open_index.begin(), open_index.end(), found);
      if (found < 0 || it == open_index.end()) {
        std::string slots;
        for (size_t s = 0; s < open_index.size(); ++s)
          slots += (s ? ", " : "") + open[static_cast<size_t>(open_index[s])].device->info().label();
        throw ConfigError("model.layers: layer '" + l.name + "' has device = \"" + l.device +
                          "\", which is not one of " + where + "'s devices (" + slots +
                          "; opened: " + open_labels(open) + ")");
      }
      slot = static_cast<int>(it - open_index.begin());
    }
    slot_of[l.name] = slot;
    out.push_back(slot);
  }
  return out;
}

// Depth of the forward pipeline: how many devices a micro-batch passes through one after another.
int pipeline_stages(const Program& p) {
  std::vector<int> depth(p.segments.size(), 1);
  std::vector<int> last_on_slot(static_cast<size_t>(p.slots), 0);
  int best = 0;
  for (size_t i = 0; i < p.segments.size(); ++i) {
    const Segment& s = p.segments[i];
    if (s.phase != Phase::forward) continue;
    int d = std::max(1, last_on_slot[static_cast<size_t>(s.slot)]);
    for (auto t : s.pulls) d = std::max(d, depth[p.transfers[t].producer] + 1);
    depth[i] = d;
    last_on_slot[static_cast<size_t>(s.slot)] = d;
    best = std::max(best, d);
  }
  return std::max(best, 1);
}

}  // namespace

Graph placed_graph(const RunnerContext& ctx, const Placement& p, int64_t rows, bool training, bool ema) {
  GraphOptions o;
  o.batch = rows;
  o.training = training;
  o.use_ema = ema;
  o.optimizer = ctx.optimizer;
  const LayerSpec* first = ctx.model->layers.data();
  o.place = [&p, first](const LayerSpec& l) { return p.layer_slot.at(static_cast<size_t>(&l - first)); };
  return build_graph(*ctx.model, o);
}

std::vector<DevicePlan> plan_model_parallel(const RunnerContext& ctx, const Placement& p, bool notes) {
  const int slots = static_cast<int>(p.open_index.size());
  const int64_t m = p.micro_batches;
  Graph train = placed_graph(ctx, p, p.micro_rows, true, false);
  Graph eval = placed_graph(ctx, p, p.micro_rows, false, false);
  Program pt = make_program(train, slots), pe = make_program(eval, slots);
  std::vector<DevicePlan> out;
  for (int s = 0; s < slots; ++s) {
    Device* dev = ctx.devices.at(static_cast<size_t>(p.open_index[static_cast<size_t>(s)])).device;
    PlanOptions ot, oe;
    ot.device = oe.device = s;
    ot.keep_alive = pt.keep_alive[static_cast<size_t>(s)];
    oe.keep_alive = pe.keep_alive[static_cast<size_t>(s)];
    MemoryPlan a = plan_memory(train, dev, ot), b = plan_memory(eval, dev, oe);
    a.arena = std::max(a.arena, b.arena);
    a.input = std::max(a.input, b.input);
    a.workspace = std::max(a.workspace, b.workspace);
    DevicePlan d = a.summary(dev->info().label());
    // Every micro-batch in flight has its own gradients, activations and input; the workspace is shared.
    d.gradients *= static_cast<size_t>(m);
    d.activations *= static_cast<size_t>(m);
    d.input_data *= static_cast<size_t>(m);
    if (notes) {
      d.notes.push_back("model_parallel slot " + std::to_string(s) + " of " + std::to_string(slots) +
                        (p.automatic ? " (placement auto)" : ""));
      for (size_t l = 0; l < ctx.model->layers.size(); ++l) {
        if (p.layer_slot[l] != s) continue;
        const auto& spec = ctx.model->layers[l];
        std::string fwd;
        size_t bwd = 0, upd = 0;
        for (const auto& n : train.nodes()) {
          if (n.layer != spec.name || n.device != s) continue;
          if (n.phase == Phase::forward)
            fwd += (fwd.empty() ? "" : ", ") + std::string(op_name(n.kind));
          else
            (n.phase == Phase::backward ? bwd : upd) += 1;
        }
        d.notes.push_back("  layer " + spec.name + " (" + spec.type + "): " + (fwd.empty() ? "no ops" : fwd) +
                          "; backward " + std::to_string(bwd) + " op(s), update " + std::to_string(upd) + " op(s)");
      }
      size_t in = 0, out_b = 0;
      std::string from, to;
      for (const auto& t : pt.transfers) {
        auto label = [&](int slot) {
          return ctx.devices.at(static_cast<size_t>(p.open_index[static_cast<size_t>(slot)])).device->info().label();
        };
        std::string what = (t.phase == Phase::forward ? "" : "gradient ") + t.from_layer + " -> " + t.to_layer + " " +
                           bytes_text(t.bytes * static_cast<size_t>(m));
        if (t.dst == s) in += t.bytes, from += (from.empty() ? "" : ", ") + what + " from " + label(t.src);
        if (t.src == s) out_b += t.bytes, to += (to.empty() ? "" : ", ") + what + " to " + label(t.dst);
      }
      d.notes.push_back("copies in per step: " + bytes_text(in * static_cast<size_t>(m)) +
                        (from.empty() ? "" : " (" + from + ")"));
      d.notes.push_back("copies out per step: " + bytes_text(out_b * static_cast<size_t>(m)) +
                        (to.empty() ? "" : " (" + to + ")"));
      if (m > 1) {
        int k = pipeline_stages(pt);
        std::ostringstream os;
        os << "pipeline: " << m << " micro-batches of " << p.micro_rows << " rows over " << k
           << " stage(s); ideal bubble (K-1)/(M+K-1) = " << std::fixed << std::setprecision(3)
           << double(k - 1) / double(m + k - 1);
        d.notes.push_back(os.str());
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<int> auto_place(const RunnerContext& ctx, int slots, int micro_batches, int64_t micro_rows,
                            const std::function<std::vector<bool>(const std::vector<int>&)>& fits) {
  const auto& layers = ctx.model->layers;
  const size_t n = layers.size();
  // Balance an estimate first: parameters and optimizer state once, gradients and activations per micro-batch.
  GraphOptions go;
  go.batch = micro_rows;
  go.optimizer = ctx.optimizer;
  Graph g = build_graph(*ctx.model, go);
  std::map<std::string, size_t> index;
  for (size_t l = 0; l < n; ++l) index[layers[l].name] = l;
  std::vector<double> cost(n, 0.0);
  for (const auto& t : g.tensors()) {
    auto it = index.find(t.layer);
    if (t.alias_of != kNoTensor || it == index.end()) continue;
    double b = static_cast<double>(t.bytes());
    cost[it->second] += role_persistent(t.role) ? b : b * micro_batches;
  }
  auto parts_for = [&](double cap, std::vector<int>* assign) {
    int part = 0;
    double acc = 0;
    for (size_t l = 0; l < n; ++l) {
      if (acc > 0 && acc + cost[l] > cap) ++part, acc = 0;
      acc += cost[l];
      if (assign) (*assign)[l] = std::min(part, slots - 1);
    }
    return part + 1;
  };
  double lo = *std::max_element(cost.begin(), cost.end()), hi = std::accumulate(cost.begin(), cost.end(), 0.0);
  for (int it = 0; it < 60 && hi - lo > 1; ++it) {
    double mid = (lo + hi) / 2;
    (parts_for(mid, nullptr) <= slots ? hi : lo) = mid;
  }
  std::vector<int> assign(n, 0);
  parts_for(hi, &assign);
  auto ok = [&](const std::vector<int>& a) {
    auto f = fits(a);
    return std::all_of(f.begin(), f.end(), [](bool b) { return b; });
  };
  if (ok(assign)) return assign;
  // The estimate missed (the arena overlaps activations; eval and workspace count too): fill each device in
  // order as far as its planned peak allows.
  size_t at = 0;
  for (int s = 0; s < slots; ++s) {
    size_t k = at;
    if (s == slots - 1) k = n;
    while (k < n) {
      std::vector<int> trial(n, 0);
      for (size_t l = 0; l < n; ++l) trial[l] = l < at ? assign[l] : l <= k ? s : s + 1;
      if (!fits(trial)[static_cast<size_t>(s)]) break;
      ++k;
    }
    for (size_t l = at; l < k; ++l) assign[l] = s;
    at = k;
  }
  return ok(assign) ? assign : std::vector<int>{};
}

Placement resolve_placement(const ModelParallelOptions& o, const RunnerContext& ctx) {
  Placement p;
  p.open_index = resolve_devices(o.devices, ctx.devices, o.where_devices);
  p.micro_batches = o.micro_batches;
  p.automatic = o.auto_place;
  const int64_t n = ctx.global_batch;
  if (n < o.micro_batches || n % o.micro_batches != 0)
    throw ConfigError(o.where + ": [train] batch_size = " + std::to_string(n) +
                      " does not split into micro_batches = " + std::to_string(o.micro_batches) +
                      " equal micro-batches; use a batch size that is a multiple of it");
  p.micro_rows = n / o.micro_batches;
  const int slots = static_cast<int>(p.open_index.size());
  if (!o.auto_place) {
    p.layer_slot = explicit_slots(*ctx.model, p.open_index, ctx.devices, o.where_devices);
    return p;
  }
  for (const auto& l : ctx.model->layers)
    if (!l.device.empty())
      throw ConfigError(o.where + ": placement = \"auto\", but layer '" + l.name + "' sets device = \"" + l.device +
                        "\"; remove the layers' device keys or the placement key");
  auto fits = [&](const std::vector<int>& assign) {
    Placement q = p;
    q.layer_slot = assign;
    auto plans = plan_model_parallel(ctx, q, false);
    std::vector<bool> f;
    for (int s = 0; s < slots; ++s)
      f.push_back(limit_fits(plans[static_cast<size_t>(s)],
                             ctx.devices[static_cast<size_t>(p.open_index[static_cast<size_t>(s)])]));
    return f;
  };
  p.layer_slot = auto_place(ctx, slots, o.micro_batches, p.micro_rows, fits);
  if (p.layer_slot.empty()) {
    Placement all = p;
    all.layer_slot.assign(ctx.model->layers.size(), 0);
    auto plans = plan_model_parallel(ctx, all, false);
    size_t limits = 0;
    for (int s = 0; s < slots; ++s)
      limits += ctx.devices[static_cast<size_t>(p.open_index[static_cast<size_t>(s)])].allocator->limit();
    throw ConfigError(o.where + ": placement = \"auto\" found no split of the model's layers over " +
                      std::to_string(slots) +
                      " device(s) where every device's planned peak fits its limit (the whole step needs " +
                      format_bytes(plans[0].total()) + " on one device; the limits add up to " + format_bytes(limits) +
                      "). Add devices, raise [device] memory_limit, or lower the batch size.");
  }
  return p;
}

}  // namespace kiln::parallel
