// Liveness-based memory planning: every tensor's lifetime is known before step 1, so the arena is laid out once.
#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <set>

#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/memory_savers.hpp"
#include "kiln/op_table.hpp"

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

namespace {

bool arena_role(const TensorInfo& t) {
  return !role_persistent(t.role) && t.role != TensorRole::input && t.role != TensorRole::label &&
         t.role != TensorRole::gradient;
}

// Which inputs output 0 of an op may share storage with (the op table's may_alias).
std::vector<size_t> aliasable_inputs(OpKind k) {
  std::vector<size_t> r;
  for (auto [o, i] : op_desc(k).may_alias)
    if (o == 0) r.push_back(static_cast<size_t>(i));
  return r;
}

// Arena placement. Up to kGreedyPlacementMax tensors: greedy by size, the largest first at the lowest offset free
// for its whole lifetime (the tightest packing; each placement scans those placed before it, so O(n^2) in the
// worst case). Above it, a sweep in step order with a best-fit free list (what an allocator that knows every
// lifetime would do): O(n log n), so a model with very many layers plans in near-linear time.
void place_arena(const Graph& g, std::vector<size_t>& arena, const std::vector<size_t>& first,
                 const std::vector<size_t>& last, size_t alignment, MemoryPlan& p) {
  auto span = [&](size_t t) { return std::pair<size_t, size_t>{first[t] == SIZE_MAX ? 0 : first[t], last[t]}; };
  if (arena.size() <= kGreedyPlacementMax) {
    std::stable_sort(arena.begin(), arena.end(),
                     [&](size_t a, size_t b) { return g.tensors()[a].bytes() > g.tensors()[b].bytes(); });
    struct Placed {
      size_t off, bytes, first, last;
    };
    std::vector<Placed> placed;  // by offset: the first gap that fits ends the scan
    placed.reserve(arena.size());
    for (auto t : arena) {
      size_t bytes = aligned_size(g.tensors()[t].bytes(), alignment);
      auto [f, l] = span(t);
      size_t off = 0;
      for (const auto& q : placed) {
        ++p.placement_steps;
        if (q.last < f || l < q.first) continue;
        if (off + bytes <= q.off) break;
        off = std::max(off, q.off + q.bytes);
      }
      Placed n{off, bytes, f, l};
      placed.insert(std::upper_bound(placed.begin(), placed.end(), n,
                                     [](const Placed& a, const Placed& b) { return a.off < b.off; }),
                    n);
      p.offset[t] = off;
      p.arena = std::max(p.arena, off + bytes);
    }
    return;
  }
  // Sweep: at step i, first free what was last used before i, then take room for what is first written at i.
  std::stable_sort(arena.begin(), arena.end(), [&](size_t a, size_t b) {
    auto sa = span(a).first, sb = span(b).first;
    return sa != sb ? sa < sb : g.tensors()[a].bytes() > g.tensors()[b].bytes();
  });
  std::map<size_t, size_t> free_at;                  // offset -> bytes
  std::set<std::pair<size_t, size_t>> free_by_size;  // (bytes, offset)
  using Live = std::pair<size_t, size_t>;            // (last step, tensor)
  std::priority_queue<Live, std::vector<Live>, std::greater<>> live;
  size_t top = 0;  // the arena's end so far
  auto release = [&](size_t off, size_t bytes) {
    ++p.placement_steps;
    auto next = free_at.lower_bound(off);
    if (next != free_at.end() && off + bytes == next->first) {
      bytes += next->second;
      free_by_size.erase({next->second, next->first});
      next = free_at.erase(next);
    }
    if (next != free_at.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        free_by_size.erase({prev->second, prev->first});
        off = prev->first;
        bytes += prev->second;
        free_at.erase(prev);
      }
    }
    free_at[off] = bytes;
    free_by_size.insert({bytes, off});
  };
  for (auto t : arena) {
    const size_t bytes = aligned_size(g.tensors()[t].bytes(), alignment);
    const auto [f, l] = span(t);
    while (!live.empty() && live.top().first < f) {
      const size_t u = live.top().second;
      live.pop();
      release(p.offset[u], aligned_size(g.tensors()[u].bytes(), alignment));
    }
    ++p.placement_steps;
    size_t off;
    if (auto it = free_by_size.lower_bound({bytes, 0}); it != free_by_size.end()) {  // best fit; the rest stays free
      off = it->second;
      const size_t len = it->first;
      free_by_size.erase(it);
      free_at.erase(off);
      if (len > bytes) {
        free_at[off + bytes] = len - bytes;
        free_by_size.insert({len - bytes, off + bytes});
      }
    } else if (!free_at.empty() && free_at.rbegin()->first + free_at.rbegin()->second == top) {  // extend the free end
      off = free_at.rbegin()->first;
      free_by_size.erase({free_at.rbegin()->second, off});
      free_at.erase(off);
      top = off + bytes;
    } else {
      off = top;
      top += bytes;
    }
    p.offset[t] = off;
    p.arena = std::max(p.arena, off + bytes);
    live.push({l, t});
  }
}

}  // namespace

Liveness analyze_liveness(const Graph& g, const PlanOptions& o) {
  const size_t nt = g.tensors().size();
  Liveness L;
  L.first.assign(nt, SIZE_MAX);
  L.last.assign(nt, 0);
  L.used.assign(nt, false);
  L.rep.resize(nt);
  for (size_t t = 0; t < nt; ++t) L.rep[t] = static_cast<int32_t>(t);
  const size_t end = g.nodes().size();
  for (size_t i = 0; i < end; ++i) {
    const Node& n = g.nodes()[i];
    if (n.device != o.device) continue;
    auto touch = [&](TensorId t, bool write) {
      auto r = static_cast<size_t>(g.root(t));
      L.used[r] = true;
      if (write) L.first[r] = std::min(L.first[r], i);
      if (!write && L.first[r] == SIZE_MAX)
        L.first[r] = i;  // read before any write here (copied in from another device)
      L.last[r] = std::max(L.last[r], i);
    };
    for (auto t : n.in) touch(t, false);
    for (auto t : n.out) touch(t, true);
  }
  for (auto t : o.keep_alive) L.last[static_cast<size_t>(g.root(t))] = end;
  for (auto t : g.losses) L.last[static_cast<size_t>(g.root(t))] = end;
  if (g.grad_sq != kNoTensor) L.last[static_cast<size_t>(g.grad_sq)] = end;  // read back as the gradient norm
  for (auto t : g.outputs) L.last[static_cast<size_t>(g.root(t))] = end;
  for (auto t : {g.input, g.label})
    if (t != kNoTensor)
      L.used[static_cast<size_t>(t)] = L.used[static_cast<size_t>(t)] || o.device == g.tensor(t).device;
  if (!g.inplace) return L;
  // In place: output 0 takes over an input's storage when nothing reads that input afterwards.
  auto cls = [&](TensorId t) { return static_cast<size_t>(L.rep[static_cast<size_t>(g.root(t))]); };
  for (size_t i = 0; i < end; ++i) {
    const Node& n = g.nodes()[i];
    if (n.device != o.device || n.out.empty()) continue;
    auto y = static_cast<size_t>(g.root(n.out[0]));
    if (!arena_role(g.tensors()[y]) || L.first[y] != i || static_cast<size_t>(L.rep[y]) != y) continue;
    for (size_t k : aliasable_inputs(n.kind)) {
      if (k >= n.in.size()) continue;
      auto xr = static_cast<size_t>(g.root(n.in[k]));
      size_t c = cls(n.in[k]);
      if (!arena_role(g.tensors()[xr]) || L.last[c] != i || L.first[c] >= i) continue;
      if (g.tensors()[c].bytes() != g.tensors()[y].bytes() || g.tensor(n.in[k]).bytes() != g.tensors()[y].bytes() ||
          g.tensor(n.in[k]).dtype != g.tensors()[y].dtype)
        continue;
      bool shared = false;  // another operand in the same storage would be overwritten while read
      for (size_t j = 0; j < n.in.size(); ++j) shared = shared || (j != k && cls(n.in[j]) == c);
      for (size_t j = 1; j < n.out.size(); ++j) shared = shared || cls(n.out[j]) == c;
      if (shared) continue;
      L.rep[y] = static_cast<int32_t>(c);
      L.last[c] = std::max(L.last[c], L.last[y]);
      break;
    }
  }
  return L;
}

MemoryPlan plan_memory(const Graph& g, Device* dev, const PlanOptions& o) {
  const size_t nt = g.tensors().size();
  MemoryPlan p;
  p.region.assign(nt, Region::none);
  p.offset.assign(nt, 0);
  Liveness L = analyze_liveness(g, o);
  const auto& first = L.first;
  const auto& last = L.last;
  const auto& used = L.used;

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
      if (static_cast<size_t>(L.rep[t]) == t) arena.push_back(t);  // in-place members take their class's place
      p.activations_unplanned += bytes;
    }
  }
  std::stable_sort(grads.begin(), grads.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
  for (auto t : grads) {
    p.offset[t] = p.gradients;
    p.gradients += aligned_size(g.tensors()[t].bytes(), o.alignment);
  }
  place_arena(g, arena, first, last, o.alignment, p);
  // In-place members share their class's placement; aliases share their root's.
  for (size_t t = 0; t < nt; ++t)
    if (p.region[t] == Region::arena && static_cast<size_t>(L.rep[t]) != t)
      p.offset[t] = p.offset[static_cast<size_t>(L.rep[t])];
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
      // Unbound views that carry each buffer's size and type: a backend sizes its workspace by them (the cpu
      // backend converts 16-bit buffers for kernels that read float32 only).
      for (auto t : n.in) c.in.push_back(BufferView{nullptr, 0, g.tensor(t).bytes(), g.tensor(t).dtype});
      for (auto t : n.out) c.out.push_back(BufferView{nullptr, 0, g.tensor(t).bytes(), g.tensor(t).dtype});
      p.workspace = std::max(p.workspace, dev->workspace_bytes(c));
    }
    if (p.workspace) p.workspace = aligned_size(p.workspace, o.alignment);
  }
  p.input_slot = p.input;
  p.input *= static_cast<size_t>(std::max(1, o.input_slots));
  return p;
}

}  // namespace kiln
