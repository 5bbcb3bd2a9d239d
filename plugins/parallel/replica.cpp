// Replica graphs (with the sharded-optimizer edit), gradient buckets, and the per-replica executor cache.
#include "replica.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "kiln/error.hpp"
#include "sharded_optimizer.hpp"

namespace kiln::parallel {

void move_ema_last(Graph& g) {
  std::vector<Node> kept, ema;
  for (auto& n : g.nodes())
    (n.phase == Phase::update && n.kind == OpKind::EmaUpdate ? ema : kept).push_back(std::move(n));
  for (auto& n : ema) kept.push_back(std::move(n));
  g.nodes() = std::move(kept);
}

Graph replica_graph(const RunnerContext& ctx, int64_t batch, bool training, bool ema, bool sharded) {
  GraphOptions o;
  o.batch = batch;
  o.training = training;
  o.use_ema = ema;
  o.optimizer = ctx.optimizer;
  Graph g = build_graph(*ctx.model, o);
  if (training && sharded)
    strip_optimizer_updates(g);
  else if (training)
    move_ema_last(g);
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
    // The last backward node writing it: update-phase nodes (clip_norm's scale) run after every reduction.
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (g.nodes()[i].phase == Phase::update) continue;
      for (auto t : g.nodes()[i].out)
        if (g.root(t) == r) writer = i, found = true;
    }
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

Replica::Replica(const RunnerContext& ctx, int device_index, int rank, bool sharded)
    : ctx_(ctx),
      dctx_(ctx.devices.at(static_cast<size_t>(device_index))),
      rank_(rank),
      sharded_(sharded),
      state_(dctx_, ctx.seed),
      input_(state_, std::max(1, ctx.input_slots)) {}

Executor& Replica::executor(int64_t batch, bool training, bool ema) {
  auto key = std::make_tuple(batch, training, ema);
  auto it = execs_.find(key);
  if (it != execs_.end()) return *it->second;
  input_.drain();  // a new executor may move the input region
  PlanOptions po;
  po.input_slots = training ? input_.slots() : 1;
  auto ex = std::make_unique<Executor>(replica_graph(ctx_, batch, training, ema, sharded_), state_, po);
  return *execs_.emplace(key, std::move(ex)).first->second;
}

std::string Replica::find_nonfinite_layer(const Element& batch, int64_t step) {
  input_.drain();
  return first_nonfinite_layer(replica_graph(ctx_, batch.batch, true, false, sharded_), state_, batch, step);
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
