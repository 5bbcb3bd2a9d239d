// Replica graphs (with the sharded-optimizer edit), gradient buckets, and the per-replica executor cache.
#include "replica.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "kiln/error.hpp"

namespace kiln::parallel {

namespace {

bool is_optimizer_update(OpKind k) { return k == OpKind::SgdUpdate || k == OpKind::AdamUpdate || k == OpKind::RmspropUpdate; }

}  // namespace

ShardMap make_shards(const Graph& g, int ranks) {
  struct Item {
    std::string name;
    size_t cost;
  };
  std::vector<Item> items;
  for (const auto& n : g.nodes()) {
    if (n.phase != Phase::update || !is_optimizer_update(n.kind)) continue;
    const auto& param = g.tensor(n.out[0]);
    size_t state = 0;
    std::set<TensorId> seen;
    for (size_t i = 1; i < n.out.size(); ++i)
      if (g.tensor(n.out[i]).role == TensorRole::optimizer_state && seen.insert(n.out[i]).second) state += g.tensor(n.out[i]).bytes();
    items.push_back({param.name, state ? state : param.bytes()});  // no state (plain SGD): balance the update work
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.cost != b.cost ? a.cost > b.cost : a.name < b.name;
  });
  std::vector<size_t> load(static_cast<size_t>(ranks), 0);
  ShardMap owners;
  for (const auto& it : items) {
    size_t best = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[best] += it.cost;
    owners[it.name] = static_cast<int>(best);
  }
  return owners;
}

void shard_updates(Graph& g, const ShardMap& owners, int rank) {
  std::vector<Node> kept, ema;
  for (auto& n : g.nodes()) {
    if (n.phase == Phase::update && n.kind == OpKind::EmaUpdate) {
      ema.push_back(std::move(n));
      continue;
    }
    if (n.phase == Phase::update && is_optimizer_update(n.kind) && !owners.empty()) {
      const std::string& name = g.tensor(n.out[0]).name;
      auto it = owners.find(name);
      if (it == owners.end()) throw Error("data_parallel: parameter '" + name + "' has no owner in the optimizer-state shards");
      if (it->second != rank) {
        for (size_t i = 1; i < n.out.size(); ++i)
          if (g.tensor(n.out[i]).role == TensorRole::optimizer_state) g.tensor(n.out[i]).device = -1;  // not on this replica
        continue;
      }
    }
    kept.push_back(std::move(n));
  }
  for (auto& n : ema) kept.push_back(std::move(n));
  g.nodes() = std::move(kept);
}

Graph replica_graph(const RunnerContext& ctx, int64_t batch, bool training, bool ema, const ShardMap& owners, int rank) {
  GraphOptions o;
  o.batch = batch;
  o.training = training;
  o.use_ema = ema;
  o.optimizer = ctx.optimizer;
  Graph g = build_graph(*ctx.model, o);
  if (training) shard_updates(g, owners, rank);
  return g;
}

std::vector<Bucket> make_buckets(const Graph& g, const MemoryPlan& p, size_t bucket_bytes) {
  struct Grad {
    size_t off, bytes, writer;
  };
  std::vector<Grad> grads;
  for (auto [param, grad] : g.param_grads) {
    TensorId r = g.root(grad);
    if (p.region[static_cast<size_t>(r)] != Region::gradients)
      throw Error("data_parallel: the gradient of '" + g.tensor(param).name + "' is not in the gradients region");
    size_t writer = 0;
    bool found = false;
    for (size_t i = 0; i < g.nodes().size(); ++i)
      for (auto t : g.nodes()[i].out)
        if (g.root(t) == r) writer = i, found = true;
    if (!found) throw Error("data_parallel: no node writes the gradient of '" + g.tensor(param).name + "'");
    grads.push_back({p.offset[static_cast<size_t>(r)], aligned_size(g.tensor(r).bytes()), writer});
  }
  std::sort(grads.begin(), grads.end(), [](const Grad& a, const Grad& b) { return a.off < b.off; });
  std::vector<Bucket> out;
  Bucket cur;
  for (const auto& gr : grads) {
    if (cur.tensors == 0) cur.begin = gr.off;
    cur.end = std::max(cur.end, gr.off + gr.bytes);
    cur.ready = std::max(cur.ready, gr.writer + 1);
    ++cur.tensors;
    if (cur.end - cur.begin >= bucket_bytes) out.push_back(cur), cur = Bucket{};
  }
  if (cur.tensors) out.push_back(cur);
  for (size_t k = 1; k < out.size(); ++k) out[k].ready = std::max(out[k].ready, out[k - 1].ready);
  return out;
}

Replica::Replica(const RunnerContext& ctx, int device_index, int rank, const ShardMap& owners)
    : ctx_(ctx), dctx_(ctx.devices.at(static_cast<size_t>(device_index))), rank_(rank), owners_(owners), state_(dctx_, ctx.seed) {}

Executor& Replica::executor(int64_t batch, bool training, bool ema) {
  auto key = std::make_tuple(batch, training, ema);
  auto it = execs_.find(key);
  if (it != execs_.end()) return *it->second;
  auto ex = std::make_unique<Executor>(replica_graph(ctx_, batch, training, ema, owners_, rank_), state_);
  return *execs_.emplace(key, std::move(ex)).first->second;
}

std::string Replica::find_nonfinite_layer(const Element& batch, int64_t step) {
  Graph g = replica_graph(ctx_, batch.batch, true, false, owners_, rank_);
  PlanOptions po;
  for (const auto& l : g.layer_outputs) po.keep_alive.push_back(l.out);
  auto layers = g.layer_outputs;
  Executor ex(std::move(g), state_, po);
  ex.load_batch(batch);
  StepScalars s;
  s.step = step;
  ex.run_range(0, ex.first_node_of(Phase::backward), s);
  for (const auto& l : layers) {
    HostTensor h = ex.read(l.out);
    for (float v : h.data)
      if (!std::isfinite(v)) return l.name + " (" + l.type + ")";
  }
  return {};
}

void Replica::run_op(OpKind kind, float alpha, const BufferView& v) {
  OpCall c;
  c.kind = kind;
  c.attrs = ElementwiseAttrs{static_cast<int64_t>(v.bytes / sizeof(float)), alpha, 0.f};
  if (kind != OpKind::Fill) c.in.push_back(v);
  c.out.push_back(v);
  dctx_.device->run(c);
}

}  // namespace kiln::parallel
