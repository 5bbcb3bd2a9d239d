// Recomputation (gradient checkpointing) as a graph pass: forward nodes of chosen layers are duplicated just
// before the backward nodes that read their outputs, and those reads are redirected to the copies.
#include "kiln/memory_savers.hpp"

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/op_table.hpp"

namespace kiln {

namespace {

bool is_loss(OpKind k) { return op_desc(k).is_loss; }

size_t first_backward(const Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].phase != Phase::forward) return i;
  return g.nodes().size();
}

// Layers (in model order) that emit at least one forward op.
std::vector<std::string> layers_with_ops(const Graph& g) {
  std::set<std::string> has;
  for (const auto& n : g.nodes())
    if (n.phase == Phase::forward && !is_loss(n.kind)) has.insert(n.layer);
  std::vector<std::string> out;
  for (const auto& l : g.layer_outputs)
    if (has.count(l.name)) out.push_back(l.name);
  return out;
}

// Recomputes the outputs of the forward nodes `drop` picks.
void recompute_where(Graph& g, const std::function<bool(const Node&)>& drop) {
  const size_t fb = first_backward(g);
  const size_t nt = g.tensors().size();
  std::vector<int64_t> producer(nt, -1);
  std::vector<bool> dropped(nt, false), excluded(nt, false);
  for (auto t : g.outputs) excluded[static_cast<size_t>(g.root(t))] = true;
  for (auto t : g.losses) excluded[static_cast<size_t>(g.root(t))] = true;
  for (size_t i = 0; i < fb; ++i) {
    const Node& n = g.nodes()[i];
    for (auto o : n.out) producer[static_cast<size_t>(g.root(o))] = static_cast<int64_t>(i);
    if (is_loss(n.kind)) {
      for (auto o : n.out) excluded[static_cast<size_t>(g.root(o))] = true;
      continue;
    }
    if (!drop(n)) continue;
    for (auto o : n.out) {
      auto r = static_cast<size_t>(g.root(o));
      dropped[r] = g.tensors()[r].role == TensorRole::activation;
    }
  }
  for (size_t t = 0; t < nt; ++t) dropped[t] = dropped[t] && !excluded[t];

  std::vector<Node> nodes(g.nodes().begin(), g.nodes().begin() + static_cast<std::ptrdiff_t>(fb));
  std::map<TensorId, TensorId> copy_of, view_of;
  std::function<TensorId(TensorId)> remap = [&](TensorId t) -> TensorId {
    TensorId r = g.root(t);
    if (!dropped[static_cast<size_t>(r)]) return t;
    if (!copy_of.count(r)) {
      Node n = g.nodes()[static_cast<size_t>(producer[static_cast<size_t>(r)])];
      for (auto& in : n.in) in = remap(in);  // recomputes dropped inputs first, back to the nearest kept tensor
      for (auto& o : n.out) {
        TensorInfo ti = g.tensor(o);  // a copy: add_tensor may reallocate
        ti.name.clear();
        // A recomputed batch norm writes its running statistics into scratch: they are updated once per step.
        if (role_persistent(ti.role)) ti.role = TensorRole::activation;
        TensorId c = g.add_tensor(std::move(ti));
        copy_of[o] = c;
        o = c;
      }
      n.phase = Phase::backward;
      nodes.push_back(std::move(n));
    }
    TensorId c = copy_of.at(r);
    if (t == r) return c;
    auto v = view_of.find(t);
    if (v != view_of.end()) return v->second;
    Shape s = g.tensor(t).shape;
    std::string layer = g.tensor(t).layer;
    return view_of[t] = g.add_alias(c, std::move(s), std::move(layer));
  };
  const size_t total = g.nodes().size();
  for (size_t i = fb; i < total; ++i) {
    Node n = g.nodes()[i];
    for (auto& in : n.in) in = remap(in);
    nodes.push_back(std::move(n));
  }
  g.nodes() = std::move(nodes);
}

void recompute(Graph& g, const std::set<std::string>& layers) {
  recompute_where(g, [&](const Node& n) { return layers.count(n.layer) != 0; });
}

// A 16-bit layer's copies of its float32 weights are cast again just before the backward ops that read them,
// rather than kept from the forward pass to the backward one: a cast moves a few bytes per weight, while keeping
// every layer's copy alive through the step would cost more activation memory than 16-bit storage saves when the
// weights are large against the activations (an MLP at a small batch).
void recast_weight_copies(Graph& g) {
  recompute_where(
      g, [&](const Node& n) { return n.kind == OpKind::Cast && role_persistent(g.tensor(g.root(n.in[0])).role); });
}

}  // namespace

std::string MemorySavers::describe() const {
  std::string s = std::string("in-place ") + (inplace ? "on" : "off") + ", recompute ";
  switch (recompute) {
    case RecomputeMode::none:
      return s + "off";
    case RecomputeMode::auto_:
      return s + "auto (" +
             (checkpoint_every > 0 ? "every " + std::to_string(checkpoint_every) + "th layer output kept)"
                                   : "the checkpoint spacing with the smallest plan)");
    case RecomputeMode::layers: {
      std::string l;
      for (const auto& n : recompute_layers) l += (l.empty() ? "" : ", ") + n;
      return s + "layers [" + l + "]";
    }
  }
  return s;
}

namespace {

// Every layer except each `every`-th one (whose output is kept as a checkpoint).
std::vector<std::string> all_but_every(const std::vector<std::string>& layers, int64_t every) {
  std::vector<std::string> out;
  for (size_t i = 0; i < layers.size(); ++i)
    if ((static_cast<int64_t>(i) + 1) % every != 0) out.push_back(layers[i]);
  return out;
}

// The activation arena of a graph's step: the largest over the devices it runs on.
size_t arena_peak(const Graph& g) {
  std::set<int> devices;
  for (const auto& n : g.nodes()) devices.insert(n.device);
  size_t peak = 0;
  for (int d : devices) {
    PlanOptions o;
    o.device = d;
    peak = std::max(peak, plan_memory(g, nullptr, o).arena);
  }
  return peak;
}

// "auto": the checkpoint spacing whose plan has the smallest activation arena (none when recomputation does not
// lower it, e.g. when the peak sits in the first layer's backward).
std::vector<std::string> best_spacing(const Graph& g, const std::vector<std::string>& layers) {
  const auto n = static_cast<int64_t>(layers.size());
  if (n < 2 || first_backward(g) == g.nodes().size()) return {};
  const auto root = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  std::set<int64_t> ks;
  for (int64_t k : {root, int64_t{2}, int64_t{3}, int64_t{4}, 2 * root, n / 2, n})
    if (k >= 2 && k <= n) ks.insert(k);
  size_t best = arena_peak(g);
  std::vector<std::string> pick;
  for (int64_t k : ks) {
    auto list = all_but_every(layers, k);
    Graph c = g;
    recompute(c, std::set<std::string>(list.begin(), list.end()));
    size_t a = arena_peak(c);
    if (a < best) best = a, pick = std::move(list);
  }
  return pick;
}

}  // namespace

std::vector<std::string> recompute_layer_list(const Graph& g, const MemorySavers& s) {
  if (s.recompute == RecomputeMode::layers) return s.recompute_layers;
  if (s.recompute == RecomputeMode::none) return {};
  auto layers = layers_with_ops(g);
  if (s.checkpoint_every > 0) return all_but_every(layers, s.checkpoint_every);
  return best_spacing(g, layers);
}

void apply_memory_savers(Graph& g, const MemorySavers& s, bool training) {
  g.inplace = s.inplace;
  if (training) recast_weight_copies(g);
  if (!training || s.recompute == RecomputeMode::none) return;
  auto list = recompute_layer_list(g, s);
  std::set<std::string> known;
  for (const auto& l : g.layer_outputs) known.insert(l.name);
  for (const auto& l : list)
    if (!known.count(l))
      throw ConfigError("[memory] recompute_layers names \"" + l + "\", which is not a layer of the model");
  if (!list.empty()) recompute(g, std::set<std::string>(list.begin(), list.end()));
}

}  // namespace kiln
