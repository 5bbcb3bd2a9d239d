// The element-sharded optimizer state (ZeRO stage 1) of data_parallel.
#include "sharded_optimizer.hpp"

#include <algorithm>

#include "kiln/error.hpp"

namespace kiln::parallel {

namespace {

constexpr int64_t kSliceAlign = 64;  // elements: 256 bytes, the allocator's alignment

bool is_optimizer_update(OpKind k) {
  return k == OpKind::SgdUpdate || k == OpKind::AdamUpdate || k == OpKind::RmspropUpdate;
}

BufferView sub(BufferView v, int64_t offset, int64_t count) {
  v.offset += static_cast<size_t>(offset) * sizeof(float);
  v.bytes = static_cast<size_t>(count) * sizeof(float);
  return v;
}

void set_count_and_scalars(OpAttrs& a, int64_t count, const StepScalars& s) {
  if (auto* x = std::get_if<SgdAttrs>(&a)) x->count = count, x->lr = s.lr * x->lr_scale;
  if (auto* x = std::get_if<AdamAttrs>(&a)) x->count = count, x->lr = s.lr * x->lr_scale, x->step = s.step + 1;
  if (auto* x = std::get_if<RmspropAttrs>(&a)) x->count = count, x->lr = s.lr * x->lr_scale;
}

}  // namespace

size_t ShardLayout::state_bytes(int r) const {
  size_t b = 0;
  for (const auto& sl : slices.at(static_cast<size_t>(r)))
    b += aligned_size(static_cast<size_t>(sl.count) * sizeof(float));
  return b * state_tensors;
}

int64_t ShardLayout::elements(int r) const {
  int64_t n = 0;
  for (const auto& sl : slices.at(static_cast<size_t>(r))) n += sl.count;
  return n;
}

ShardLayout make_shard_layout(const Graph& g, int ranks) {
  ShardLayout l;
  std::vector<std::pair<size_t, ParamUpdate>> order;  // (node writing the gradient, update)
  for (const auto& n : g.nodes()) {
    if (n.phase != Phase::update || !is_optimizer_update(n.kind)) continue;
    ParamUpdate u;
    const auto& p = g.tensor(n.out[0]);
    u.name = p.name;
    u.shape = p.shape;
    u.kind = n.kind;
    u.attrs = n.attrs;
    for (size_t i = 1; i < n.out.size(); ++i)
      u.state_names.push_back(n.out[i] == n.out[0] ? std::string() : g.tensor(n.out[i]).name);
    TensorId grad = g.root(n.in[0]);
    size_t writer = 0;
    for (size_t i = 0; i < g.nodes().size(); ++i)
      for (auto t : g.nodes()[i].out)
        if (g.root(t) == grad) writer = i;
    order.emplace_back(writer, std::move(u));
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [w, u] : order) {
    (void)w;
    l.total_elements += u.shape.numel();
    l.params.push_back(std::move(u));
  }
  if (!l.params.empty())
    for (const auto& s : l.params[0].state_names) l.state_tensors += s.empty() ? 0 : 1;
  l.slices.resize(static_cast<size_t>(ranks));
  const int64_t target = (l.total_elements + ranks - 1) / ranks;
  int rank = 0;
  int64_t quota = target;
  for (size_t p = 0; p < l.params.size(); ++p) {
    const int64_t n = l.params[p].shape.numel();
    int64_t off = 0;
    while (off < n) {
      int64_t take = n - off;
      if (rank < ranks - 1 && take > quota) {
        take = quota / kSliceAlign * kSliceAlign;  // cut inside the parameter on an aligned element
        if (take == 0) {
          ++rank, quota = target;
          continue;
        }
      }
      l.slices[static_cast<size_t>(rank)].push_back({p, off, take});
      off += take;
      quota -= take;
      if (quota <= 0 && rank < ranks - 1) ++rank, quota = target;
    }
  }
  return l;
}

void strip_optimizer_updates(Graph& g) {
  std::vector<Node> kept, ema;
  for (auto& n : g.nodes()) {
    if (n.phase == Phase::update && n.kind == OpKind::EmaUpdate) {
      ema.push_back(std::move(n));
    } else if (n.phase == Phase::update && is_optimizer_update(n.kind)) {
      for (size_t i = 1; i < n.out.size(); ++i)
        if (g.tensor(n.out[i]).role == TensorRole::optimizer_state)
          g.tensor(n.out[i]).device = -1;  // kept by the shards
    } else {
      kept.push_back(std::move(n));
    }
  }
  for (auto& n : ema) kept.push_back(std::move(n));
  g.nodes() = std::move(kept);
}

ShardedOptimizer::ShardedOptimizer(const ShardLayout& layout, int rank, DeviceContext dctx)
    : layout_(layout), rank_(rank), dctx_(dctx) {
  const auto& mine = layout_.slices.at(static_cast<size_t>(rank));
  size_t at = 0;
  for (const auto& sl : mine) {
    offset_.push_back(at);
    at += aligned_size(static_cast<size_t>(sl.count) * sizeof(float));
  }
  for (size_t k = 0; k < layout_.state_tensors && at > 0; ++k) {
    state_.push_back(dctx_.allocator->allocate(
        at, AllocationSite{MemoryTag::optimizer_state,
                           "optimizer state shard " + std::to_string(rank) + " (data_parallel)"}));
    OpCall zero;  // the optimizers' state starts at zero
    zero.kind = OpKind::Fill;
    zero.attrs = ElementwiseAttrs{static_cast<int64_t>(at / sizeof(float)), 0.f, 0.f};
    zero.out = {state_.back().view()};
    dctx_.device->run(zero);
  }
}

BufferView ShardedOptimizer::state_view(size_t slice, size_t k) const {
  BufferView v = state_.at(k).view();
  v.offset += offset_.at(slice);
  v.bytes = static_cast<size_t>(layout_.slices[static_cast<size_t>(rank_)][slice].count) * sizeof(float);
  return v;
}

BufferView ShardedOptimizer::weight_slice(const ShardLayout& layout, const DeviceState& state, const ShardSlice& sl) {
  return sub(state.persistent(layout.params.at(sl.param).name), sl.offset, sl.count);
}

void ShardedOptimizer::update(const Executor& ex, const StepScalars& s) {
  auto it = ids_.find(&ex);
  if (it == ids_.end()) {
    const Graph& g = ex.graph();
    std::vector<std::pair<TensorId, TensorId>> ids;
    for (const auto& u : layout_.params) {
      TensorId p = g.find(u.name), gr = kNoTensor;
      for (auto [param, grad] : g.param_grads)
        if (param == p) gr = grad;
      if (p == kNoTensor || gr == kNoTensor)
        throw Error("data_parallel: no gradient for '" + u.name + "' in the replica's graph");
      ids.emplace_back(p, gr);
    }
    it = ids_.emplace(&ex, std::move(ids)).first;
  }
  const auto& mine = layout_.slices[static_cast<size_t>(rank_)];
  for (size_t i = 0; i < mine.size(); ++i) {
    const ShardSlice& sl = mine[i];
    const ParamUpdate& u = layout_.params[sl.param];
    auto [p, gr] = it->second[sl.param];
    OpCall c;
    c.kind = u.kind;
    c.attrs = u.attrs;
    set_count_and_scalars(c.attrs, sl.count, s);
    c.in = {sub(ex.view(gr), sl.offset, sl.count)};
    const BufferView w = sub(ex.view(p), sl.offset, sl.count);
    c.out = {w};
    size_t k = 0;
    for (const auto& name : u.state_names) c.out.push_back(name.empty() ? w : state_view(i, k++));
    dctx_.device->run(c);
  }
}

void ShardedOptimizer::gather(std::map<std::string, HostTensor>& out) {
  const auto& mine = layout_.slices[static_cast<size_t>(rank_)];
  for (size_t i = 0; i < mine.size(); ++i) {
    const ParamUpdate& u = layout_.params[mine[i].param];
    size_t k = 0;
    for (const auto& name : u.state_names) {
      if (name.empty()) continue;
      auto [t, fresh] = out.try_emplace(name, u.shape);
      (void)fresh;
      dctx_.device->copy_to_host(state_view(i, k++), t->second.data.data() + mine[i].offset);
    }
  }
}

std::vector<std::string> ShardedOptimizer::scatter(const std::map<std::string, HostTensor>& in) {
  std::vector<std::string> used;
  const auto& mine = layout_.slices[static_cast<size_t>(rank_)];
  for (size_t i = 0; i < mine.size(); ++i) {
    const ParamUpdate& u = layout_.params[mine[i].param];
    size_t k = 0;
    for (const auto& name : u.state_names) {
      if (name.empty()) continue;
      const size_t kk = k++;
      auto it = in.find(name);
      if (it == in.end()) continue;
      if (it->second.shape != u.shape)
        throw Error("checkpoint tensor '" + name + "' has shape " + it->second.shape.str() + ", the model has " +
                    u.shape.str());
      dctx_.device->copy_from_host(it->second.data.data() + mine[i].offset, state_view(i, kk));
      used.push_back(name);
    }
  }
  return used;
}

}  // namespace kiln::parallel
