// Liveness-based memory planning: every tensor's lifetime is known before step 1, so the arena is laid out once.
#include <algorithm>
#include <numeric>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"

namespace kiln {

DevicePlan MemoryPlan::summary(const std::string& label) const {
  DevicePlan d;
  d.device = label;
  d.parameters = persistent_by_tag[static_cast<size_t>(MemoryTag::parameters)];
  d.optimizer_state = persistent_by_tag[static_cast<size_t>(MemoryTag::optimizer_state)];
  d.gradients = gradients;
  d.activations = arena;
  d.workspace = workspace;
  d.input_data = input;
  return d;
}

MemoryPlan plan_memory(const Graph& g, Device* dev, const PlanOptions& o) {
  const size_t nt = g.tensors().size();
  MemoryPlan p;
  p.region.assign(nt, Region::none);
  p.offset.assign(nt, 0);
  const size_t end = g.nodes().size();
  std::vector<size_t> first(nt, SIZE_MAX), last(nt, 0);
  std::vector<bool> used(nt, false);
  // Nodes of this device only.
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.device != o.device) continue;
    auto touch = [&](TensorId t, bool write) {
      auto r = static_cast<size_t>(g.root(t));
      used[r] = true;
      if (write) first[r] = std::min(first[r], i);
      if (!write && first[r] == SIZE_MAX) first[r] = i;  // read before any write here (copied in from another device)
      last[r] = std::max(last[r], i);
    };
    for (auto t : n.in) touch(t, false);
    for (auto t : n.out) touch(t, true);
  }
  for (auto t : o.keep_alive) last[static_cast<size_t>(g.root(t))] = end;
  for (auto t : g.losses) last[static_cast<size_t>(g.root(t))] = end;
  for (auto t : g.outputs) last[static_cast<size_t>(g.root(t))] = end;
  for (auto t : {g.input, g.label})
    if (t != kNoTensor) used[static_cast<size_t>(t)] = used[static_cast<size_t>(t)] || o.device == g.tensor(t).device;

  // Gradients in the order backward produces them, so buckets fill front to back.
  std::vector<size_t> grads;
  std::vector<size_t> arena;
  for (size_t t = 0; t < nt; ++t) {
    const auto& ti = g.tensors()[t];
    if (ti.alias_of != kNoTensor || !used[t]) continue;
    size_t bytes = aligned_size(ti.bytes(), o.alignment);
    if (role_persistent(ti.role)) {
      p.region[t] = Region::persistent;
      p.persistent_by_tag[static_cast<size_t>(role_tag(ti.role))] += bytes;
    } else if (ti.role == TensorRole::input || ti.role == TensorRole::label) {
      p.region[t] = Region::input;
      p.offset[t] = p.input;
      p.input += bytes;
    } else if (ti.role == TensorRole::gradient) {
      p.region[t] = Region::gradients;
      grads.push_back(t);
    } else {
      p.region[t] = Region::arena;
      arena.push_back(t);
      p.activations_unplanned += bytes;
    }
  }
  std::stable_sort(grads.begin(), grads.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
  for (auto t : grads) {
    p.offset[t] = p.gradients;
    p.gradients += aligned_size(g.tensors()[t].bytes(), o.alignment);
  }
  // Greedy by size: place the largest tensors first at the lowest offset free for their whole lifetime.
  std::stable_sort(arena.begin(), arena.end(), [&](size_t a, size_t b) { return g.tensors()[a].bytes() > g.tensors()[b].bytes(); });
  struct Placed {
    size_t off, bytes, first, last;
  };
  std::vector<Placed> placed;
  for (auto t : arena) {
    size_t bytes = aligned_size(g.tensors()[t].bytes(), o.alignment);
    size_t f = first[t] == SIZE_MAX ? 0 : first[t], l = last[t];
    std::vector<std::pair<size_t, size_t>> busy;
    for (const auto& q : placed)
      if (!(q.last < f || l < q.first)) busy.push_back({q.off, q.off + q.bytes});
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (auto [b, e] : busy) {
      if (off + bytes <= b) break;
      off = std::max(off, e);
    }
    placed.push_back({off, bytes, f, l});
    p.offset[t] = off;
    p.arena = std::max(p.arena, off + bytes);
  }
  // Aliases share their root's placement.
  for (size_t t = 0; t < nt; ++t)
    if (g.tensors()[t].alias_of != kNoTensor) {
      auto r = static_cast<size_t>(g.root(static_cast<TensorId>(t)));
      p.region[t] = p.region[r];
      p.offset[t] = p.offset[r];
    }
  if (dev) {
    for (const auto& n : g.nodes()) {
      if (n.device != o.device) continue;
      OpCall c;
      c.kind = n.kind;
      c.attrs = n.attrs;
      p.workspace = std::max(p.workspace, dev->workspace_bytes(c));
    }
    if (p.workspace) p.workspace = aligned_size(p.workspace, o.alignment);
  }
  return p;
}

}  // namespace kiln
