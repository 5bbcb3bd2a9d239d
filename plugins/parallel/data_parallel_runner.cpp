// The data-parallel runner: replicas step together; gradient buckets are all-reduced by a communication lane
// while the replicas' backward passes are still running.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <iomanip>
#include <set>
#include <sstream>

#include "data_parallel.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "lanes.hpp"
#include "replica.hpp"
#include "sharded_optimizer.hpp"
#include "sync_batch_norm.hpp"

namespace kiln::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

BufferView range_of(const BufferView& region, const Bucket& b) {
  BufferView v = region;
  v.offset += b.begin;
  v.bytes = b.end - b.begin;
  return v;
}

size_t first_of_kind(const Graph& g, OpKind k, size_t from) {
  for (size_t i = from; i < g.nodes().size(); ++i)
    if (g.nodes()[i].kind == k) return i;
  return g.nodes().size();
}

class DataParallelRunner final : public Runner {
 public:
  DataParallelRunner(const DataParallelOptions& o, const RunnerContext& ctx, std::unique_ptr<Communicator> comm,
                     std::shared_ptr<void> keep)
      : keep_(std::move(keep)), o_(o), ctx_(ctx), comm_(std::move(comm)) {
    dev_ = resolve_devices(o_.devices, ctx_.devices, o_.where_devices);
    const int n = static_cast<int>(dev_.size());
    procs_ = group_size(o_);
    first_ = group_rank(o_) * n;
    const int all = procs_ * n;  // replicas of every process
    base_rows_ = local_rows(ctx_.global_batch);
    if (o_.sharded)
      layout_ =
          std::make_unique<ShardLayout>(make_shard_layout(replica_graph(ctx_, base_rows_[0], true, false, false), all));
    for (int r = 0; r < n; ++r) {
      reps_.push_back(std::make_unique<Replica>(ctx_, dev_[static_cast<size_t>(r)], r, o_.sharded));
      devices_.push_back(&reps_.back()->device());
      mixed_ = mixed_ || devices_.back()->info().backend != devices_[0]->info().backend;
      stats_.emplace_back();
    }
    // Overlap has the communication lane copy from a device while its replica computes; only host-memory devices
    // are known to allow that, so others reduce once every replica has finished its backward pass.
    for (auto* d : devices_) overlap_ = overlap_ && d->info().host_addressable;
    if (comm_->size() != n)
      throw Error("data_parallel: the communicator has " + std::to_string(comm_->size()) + " ranks for " +
                  std::to_string(n) + " replicas");
    for (int r = 0; r < n; ++r)
      reps_[static_cast<size_t>(r)]->executor(base_rows_[static_cast<size_t>(r)], true, false);
    const Graph& g0 = reps_[0]->executor(base_rows_[0], true, false).graph();
    if (layout_)
      for (const auto& u : layout_->params) param_names_.push_back(u.name);
    else
      for (auto [param, grad] : g0.param_grads) param_names_.push_back(g0.tensor(param).name);
    for (const auto& t : g0.tensors())
      if (t.role == TensorRole::buffer && t.alias_of == kNoTensor) buffer_names_.push_back(t.name);
    // Weights sent after each update: each shard's slices from their owner; across backends (whose rounding may
    // differ) every weight from replica 0.
    if (o_.sharded) {
      // Shards are numbered over every process's replicas; each owner's slices go to every replica of every process.
      for (int r = 0; r < n; ++r)
        shards_.push_back(std::make_unique<ShardedOptimizer>(
            *layout_, first_ + r, ctx_.devices.at(static_cast<size_t>(dev_[static_cast<size_t>(r)]))));
      for (int g = 0; g < all; ++g)
        for (const auto& sl : layout_->slices[static_cast<size_t>(g)]) sends_.push_back({sl, g});
    } else if (mixed_) {
      for (size_t p = 0; p < param_names_.size(); ++p) sends_.push_back({ShardSlice{p, 0, -1}, 0});
    }
    for (int r = 0; r < n; ++r) {
      auto& rep = *reps_[static_cast<size_t>(r)];
      rep.executor(base_rows_[static_cast<size_t>(r)], false, false);
      if (ctx_.optimizer && ctx_.optimizer->ema_decay > 0)
        rep.executor(base_rows_[static_cast<size_t>(r)], false, true);
    }
    std::vector<std::string> names;
    for (int r = 0; r < n; ++r)
      names.push_back("replica " + std::to_string(r) + " (" + devices_[static_cast<size_t>(r)]->info().label() + ")");
    if (!o_.concurrent) names = {"replicas " + devices_[0]->info().label() + ".." + devices_.back()->info().label()};
    // One replica in one process has nothing to reduce or send: no communication lane.
    if (all > 1) names.push_back("the gradient all-reduce (" + o_.communicator + " communicator)");
    lanes_ = std::make_unique<Lanes>(names);
    comm_lane_ = all > 1 ? lanes_->size() - 1 : -1;
    // Every process starts from rank 0's weights and buffers (the same seed gives the same ones; this makes sure).
    if (procs_ > 1) {
      std::vector<BufferView> views(reps_.size());
      std::vector<std::string> names_to_send = param_names_;
      names_to_send.insert(names_to_send.end(), buffer_names_.begin(), buffer_names_.end());
      for (const auto& name : names_to_send) {
        for (size_t r = 0; r < reps_.size(); ++r) views[r] = reps_[r]->state().persistent(name);
        comm_->broadcast(views, devices_, 0);
      }
    }
  }

  ~DataParallelRunner() override { drain(); }  // uploads may still read prefetched_ parts

  // Splits the coming batch now and starts copying each replica's rows into its second input slot.
  void prefetch(const Element& next) override {
    if (next.x.data.empty()) return;
    auto rows = rows_for(next.batch, true);
    Prefetched p{next.x.data.data(), {}};
    auto parts = split(next, rows, row_offset(next.batch), p.parts);
    for (size_t r = 0; r < reps_.size(); ++r) {
      if (rows[r] == 0) continue;
      Executor& ex = reps_[r]->executor(rows[r], true, false);
      reps_[r]->input().prefetch(ex, *parts[r], p.key);
    }
    prefetched_.push_back(std::move(p));
  }

  StepResult train_step(const Element& batch, const StepScalars& s) override {
    auto t_step = Clock::now();
    const int n = static_cast<int>(reps_.size());
    auto rows = rows_for(batch.batch, true);
    const void* key = batch.x.data.data();
    // This batch's rows as prefetch() split them (the front entry), or split now when it was not prefetched (the
    // front entry, if any, is then a later batch: its uploads may still be reading it).
    const bool was_prefetched = !prefetched_.empty() && prefetched_.front().key == key;
    std::vector<const Element*> parts;
    if (was_prefetched && !prefetched_.front().parts.empty()) {
      for (auto& e : prefetched_.front().parts) parts.push_back(&e);
    } else {
      parts = split(batch, rows, row_offset(batch.batch));
    }
    slot_.assign(reps_.size(), 0);
    std::vector<Executor*> ex(static_cast<size_t>(n));
    std::vector<const std::vector<Bucket>*> buckets(static_cast<size_t>(n));
    for (size_t r = 0; r < ex.size(); ++r) {
      ex[r] = &reps_[r]->executor(rows[r] > 0 ? rows[r] : base_rows_[r], true, false);
      buckets[r] = &buckets_for(*ex[r]);
      bool same = buckets[r]->size() == buckets[0]->size();
      for (size_t k = 0; same && k < buckets[0]->size(); ++k)
        same = (*buckets[r])[k].begin == (*buckets[0])[k].begin && (*buckets[r])[k].end == (*buckets[0])[k].end;
      if (!same)
        throw Error("data_parallel: replica " + std::to_string(r) +
                    " lays out its gradients differently from replica 0 (" + std::to_string(buckets[r]->size()) +
                    " vs " + std::to_string(buckets[0]->size()) + " buckets)");
    }
    const size_t fwd_end = ex[0]->first_node_of(Phase::backward);
    std::vector<std::vector<float>> losses(static_cast<size_t>(n));
    // The forward pass, in segments that end at each synchronized batch norm: the replicas run up to it, the
    // statistics over every replica's rows are computed here, and they go on from the node after it.
    const auto sync_fwd = sync_nodes(ex, 0, fwd_end);
    size_t at = 0;
    for (size_t seg = 0; seg <= sync_fwd.size(); ++seg) {
      const bool last = seg == sync_fwd.size();
      const size_t stop = last ? fwd_end : sync_fwd[seg];
      lanes_->run([&](int lane) {
        each_replica(lane, [&](size_t r) {
          if (rows[r] == 0) return;
          auto t0 = Clock::now();
          if (seg == 0) slot_[r] = reps_[r]->input().acquire(*ex[r], *parts[r], key);  // prefetched, or copied now
          ex[r]->run_range(at, stop, s, slot_[r]);
          if (last)
            for (auto t : ex[r]->graph().losses) losses[r].push_back(ex[r]->read_scalar(t));
          stats_[r].compute += since(t0);
        });
      });
      if (!last) sync_batch_norm(ex, rows, batch.batch, stop);
      at = stop + 1;
    }
    if (was_prefetched) prefetched_.pop_front();  // every replica waited on its upload: nothing reads the rows now
    StepResult res;
    res.losses.assign(ex[0]->graph().losses.size(), 0.f);
    for (size_t r = 0; r < ex.size(); ++r)
      for (size_t i = 0; i < losses[r].size(); ++i)
        res.losses[i] += static_cast<float>(static_cast<double>(losses[r][i]) * static_cast<double>(rows[r]) /
                                            static_cast<double>(batch.batch));
    if (procs_ > 1) o_.group->all_reduce_sum(res.losses);  // every process decides on the same (global) loss
    for (float l : res.losses) res.total_loss += l;
    if (!std::isfinite(res.total_loss)) return res;  // no replica changes its weights

    const size_t nb = buckets[0]->size();
    ready_.assign(nb, 0);
    reduced_ = comm_lane_ < 0 ? nb : 0;
    backward_done_ = updated_ = 0;
    sent_ = comm_lane_ < 0;
    // Backward up to the last synchronized batch norm runs in segments too (each such node's input gradient needs
    // sums over every replica's rows, and a recomputed one's forward the global statistics again); gradient
    // buckets are reduced from there on, while the rest runs.
    const size_t bwd_begin = ex[0]->first_node_of(Phase::backward);
    const auto sync_bwd = sync_nodes(ex, bwd_begin, ex[0]->first_node_of(Phase::update));
    size_t bwd_at = bwd_begin;
    for (size_t node : sync_bwd) {
      lanes_->run([&](int lane) {
        each_replica(lane, [&](size_t r) {
          if (rows[r] == 0) return;
          auto t0 = Clock::now();
          ex[r]->run_range(bwd_at, node, s, slot_[r]);
          stats_[r].compute += since(t0);
        });
      });
      sync_batch_norm(ex, rows, batch.batch, node);
      bwd_at = node + 1;
    }
    lanes_->run([&](int lane) {
      if (lane == comm_lane_) return reduce_and_send(*buckets[0]);
      each_replica(lane, [&](size_t r) { backward(r, *ex[r], *buckets[r], rows[r], batch.batch, s, bwd_at); });
      each_replica(lane, [&](size_t r) { update(r, *ex[r], s, false); });
      each_replica(lane, [&](size_t r) { update(r, *ex[r], s, true); });
    });
    // Every replica clipped the same all-reduced gradient: replica 0's norm is the global one.
    if (ex[0]->graph().grad_sq != kNoTensor) res.grad_norm = std::sqrt(ex[0]->read_scalar(ex[0]->graph().grad_sq));
    for (size_t r = 0; r < ex.size(); ++r) stats_[r].examples += rows[r], ++stats_[r].steps;
    ++steps_;
    step_seconds_ += since(t_step);
    return res;
  }

  EvalResult eval_batch(const Element& batch, bool use_ema) override {
    drain();  // evaluation reads input slot 0
    sync_buffers();
    auto rows = rows_for(batch.batch, false);
    auto parts = split(batch, rows, row_offset(batch.batch));
    const size_t n = reps_.size();
    std::vector<Executor*> ex(n, nullptr);
    for (size_t r = 0; r < n; ++r)
      if (rows[r] > 0) ex[r] = &reps_[r]->executor(rows[r], false, use_ema);
    std::vector<EvalResult> part(n);
    lanes_->run([&](int lane) {
      each_replica(lane, [&](size_t r) {
        if (!ex[r]) return;
        ex[r]->load_batch(*parts[r]);
        ex[r]->run({});
        for (size_t i = 0; i < ex[r]->graph().losses.size(); ++i) {
          part[r].losses.push_back(ex[r]->read_scalar(ex[r]->graph().losses[i]) * static_cast<float>(rows[r]));
          part[r].outputs.push_back(ex[r]->read(ex[r]->graph().outputs[i]));
        }
      });
    });
    EvalResult out;
    const size_t heads = ctx_.model->outputs.size();
    for (size_t i = 0; i < heads; ++i) {
      float sum = 0;
      std::vector<HostTensor> outs;
      for (size_t r = 0; r < n; ++r)
        if (ex[r]) sum += part[r].losses[i], outs.push_back(std::move(part[r].outputs[i]));
      out.losses.push_back(sum);
      out.outputs.push_back(outs.empty() ? HostTensor{} : concat_rows(outs));
    }
    if (procs_ > 1) gather_eval(out);
    return out;
  }

  // Replica 0's tensors plus the optimizer-state shards of the others. Every tensor two replicas of one backend
  // both hold must be bit-identical: a difference means the replicas diverged, which is reported, not saved.
  std::map<std::string, HostTensor> save_state() override {
    sync_buffers();
    auto all = reps_[0]->state().read_all();
    for (size_t r = 1; r < reps_.size(); ++r)
      for (auto& [name, t] : reps_[r]->state().read_all()) {
        auto it = all.find(name);
        if (it == all.end()) {
          all.emplace(name, std::move(t));
          continue;
        }
        if (it->second.data == t.data) continue;
        // Across backends only the weights are kept identical (re-sent from replica 0); replica 0's optimizer state
        // and EMA are the ones that count there.
        if (mixed_ && !std::count(param_names_.begin(), param_names_.end(), name)) continue;
        double worst = 0;
        for (size_t i = 0; i < t.data.size(); ++i)
          worst = std::max(worst, std::fabs(double(t.data[i]) - double(it->second.data[i])));
        throw Error("data_parallel: replica " + std::to_string(r) + " (" + reps_[r]->label() +
                    ") holds different values for '" + name + "' than replica 0 (" + reps_[0]->label() +
                    "), largest difference " + std::to_string(worst) +
                    "; the replicas diverged and no state was saved");
      }
    if (procs_ > 1) check_same_state(all);
    for (auto& sh : shards_) sh->gather(all);  // each shard's slices of the optimizer state
    if (procs_ > 1 && layout_) {
      // The other processes' slices: each tensor is zero outside its owners' slices, so the sum over processes
      // is exact, and the checkpoint holds whole tensors however many processes wrote it.
      for (const auto& u : layout_->params)
        for (const auto& name : u.state_names)
          if (!name.empty()) all.try_emplace(name, u.shape);
      for (const auto& u : layout_->params)
        for (const auto& name : u.state_names)
          if (!name.empty()) o_.group->all_reduce_sum(all.at(name).data);
    }
    return all;
  }

  void load_state(const std::map<std::string, HostTensor>& st) override {
    std::set<std::string> sharded;
    for (auto& sh : shards_)
      for (auto& name : sh->scatter(st)) sharded.insert(name);
    for (const auto& [name, t] : st) {
      bool found = sharded.count(name) != 0;
      for (auto& rep : reps_)
        if (rep->state().has(name)) rep->state().write(name, t), found = true;
      if (!found) throw Error("checkpoint tensor '" + name + "' does not exist in this model");
    }
  }

  std::string find_nonfinite_layer(const Element& batch, int64_t step) override {
    drain();
    auto rows = rows_for(batch.batch, false);
    auto parts = split(batch, rows, row_offset(batch.batch));
    for (size_t r = 0; r < reps_.size(); ++r)
      if (rows[r] > 0)
        if (auto l = reps_[r]->find_nonfinite_layer(*parts[r], step); !l.empty()) return l + " on " + reps_[r]->label();
    return {};
  }

  std::vector<DevicePlan> plan() const override { return plan_data_parallel(o_, ctx_); }

  std::string report() const override {
    std::ostringstream os;
    const size_t n = reps_.size();
    os << "data_parallel: " << n << " replica(s)"
       << (procs_ > 1 ? " in each of " + std::to_string(procs_) + " processes" : "") << ", global batch "
       << ctx_.global_batch << ", optimizer state " << (o_.sharded ? "sharded" : "replicated") << ", "
       << o_.communicator << " communicator"
       << (o_.group && o_.communicator != o_.process_group ? " across the " + o_.process_group + " process group" : "")
       << ", buckets of " << bytes_text(o_.bucket_bytes)
       << (overlap_ ? " reduced during backward" : " reduced after backward") << "\n";
    for (size_t r = 0; r < n; ++r) {
      const auto& st = stats_[r];
      os << "  replica " << r << " on " << reps_[r]->label() << ": batch " << base_rows_[r];
      if (st.steps > 0 && st.compute > 0) {
        os << std::fixed << std::setprecision(0) << ", " << static_cast<double>(st.examples) / st.compute
           << " examples/s of compute, " << std::setprecision(3) << st.compute * 1e3 / static_cast<double>(st.steps)
           << " ms/batch computing, " << st.wait * 1e3 / static_cast<double>(st.steps)
           << " ms/batch waiting for gradients";
      }
      os << "\n";
    }
    if (steps_ > 0) {
      int64_t examples = 0;
      for (const auto& st : stats_) examples += st.examples;
      double hidden = comm_seconds_ > 0 ? std::clamp(1.0 - exposed_seconds_ / comm_seconds_, 0.0, 1.0) : 1.0;
      os << std::fixed << std::setprecision(0) << "  total: " << static_cast<double>(examples) / step_seconds_
         << " examples/s, " << std::setprecision(4) << step_seconds_ / static_cast<double>(steps_)
         << " s/batch; all-reduce " << std::setprecision(3) << comm_seconds_ * 1e3 / static_cast<double>(steps_)
         << " ms/step, " << std::setprecision(0) << hidden * 100 << "% of it hidden behind backward\n";
    }
    return os.str();
  }

 private:
  template <class F>
  void each_replica(int lane, F&& f) {
    if (o_.concurrent) {
      if (lane < static_cast<int>(reps_.size())) f(static_cast<size_t>(lane));
    } else if (lane == 0) {
      for (size_t r = 0; r < reps_.size(); ++r) {
        try {
          f(r);
        } catch (const Aborted&) {
          throw;
        } catch (...) {  // one lane runs every replica: name the one that failed
          rethrow_with_prefix(std::current_exception(),
                              "replica " + std::to_string(r) + " (" + reps_[r]->label() + "): ");
        }
      }
    }
  }

  // This process's replicas' rows of a batch of `n` split over every replica of every process.
  std::vector<int64_t> local_rows(int64_t n) const {
    const auto rows = split_rows(n, procs_ * static_cast<int>(dev_.size()));
    return {rows.begin() + first_, rows.begin() + first_ + static_cast<std::ptrdiff_t>(dev_.size())};
  }
  // The first row of this process's share.
  int64_t row_offset(int64_t n) const {
    const auto rows = split_rows(n, procs_ * static_cast<int>(dev_.size()));
    int64_t at = 0;
    for (int g = 0; g < first_; ++g) at += rows[static_cast<size_t>(g)];
    return at;
  }

  std::vector<int64_t> rows_for(int64_t n, bool training) const {
    const int parts = procs_ * static_cast<int>(reps_.size());
    if (training && n == ctx_.global_batch && n % parts != 0 && !o_.uneven)
      throw ConfigError(o_.where + ": a batch of " + std::to_string(n) + " does not split evenly over " +
                        std::to_string(parts) +
                        " replicas; set uneven = true to weight each replica's gradient by its share");
    return local_rows(n);
  }

  // Per replica: its rows of the batch, from row `offset` on (the batch itself when one replica takes all of it).
  std::vector<const Element*> split(const Element& b, const std::vector<int64_t>& rows, int64_t offset) {
    return split(b, rows, offset, parts_);
  }
  // The same, keeping the sliced rows in `storage` (cleared first).
  static std::vector<const Element*> split(const Element& b, const std::vector<int64_t>& rows, int64_t offset,
                                           std::vector<Element>& storage) {
    storage.clear();
    if (rows.size() == 1 && offset == 0 && rows[0] == b.batch) return {&b};
    storage.reserve(rows.size());
    int64_t at = offset;
    for (auto n : rows) storage.push_back(slice_rows(b, at, n)), at += n;
    std::vector<const Element*> out;
    for (auto& p : storage) out.push_back(&p);
    return out;
  }

  const std::vector<Bucket>& buckets_for(const Executor& ex) {
    auto it = buckets_.find(&ex);
    if (it != buckets_.end()) return it->second;
    if (ex.size() != ex.graph().nodes().size())
      throw Error("data_parallel: a replica graph has nodes placed on another device");
    return buckets_.emplace(&ex, make_buckets(ex.graph(), ex.plan(), o_.bucket_bytes)).first->second;
  }

  // Replica r's backward pass from node `from` (the first backward node, or the one after the last synchronized
  // batch norm), each gradient bucket signalled to the communication lane as soon as it is complete.
  void backward(size_t r, Executor& ex, const std::vector<Bucket>& bk, int64_t rows, int64_t global,
                const StepScalars& s, size_t from) {
    Replica& rep = *reps_[r];
    auto t0 = Clock::now();
    const BufferView grads = rep.state().region(Region::gradients);
    const float share = static_cast<float>(static_cast<double>(rows) / static_cast<double>(global));
    const size_t end = ex.first_node_of(Phase::update);
    size_t at = from;
    for (size_t k = 0; k < bk.size(); ++k) {
      const bool last = k + 1 == bk.size();
      if (rows > 0) {
        // The last bucket also takes backward's trailing nodes; a bucket completed before `from` runs nothing.
        const size_t stop = last ? end : std::max(at, bk[k].ready);
        ex.run_range(at, stop, s, slot_[r]);
        at = stop;
        if (share != 1.f) rep.run_op(OpKind::Scale, share, range_of(grads, bk[k]));
      } else {
        rep.run_op(OpKind::Fill, 0.f, range_of(grads, bk[k]));  // a replica without rows contributes nothing
      }
      rep.device().synchronize();
      if (last) finish_backward(r, t0);  // before the signal that lets the last reduction start
      lanes_->signal([&] { ++ready_[k]; });
    }
    if (bk.empty()) {
      if (rows > 0) ex.run_range(at, end, s, slot_[r]);
      rep.device().synchronize();
      finish_backward(r, t0);
    }
  }

  // The synchronized batch norms among nodes [begin, end) (sync_batch_norm.hpp); none with one replica in all.
  std::vector<size_t> sync_nodes(const std::vector<Executor*>& ex, size_t begin, size_t end) const {
    if (procs_ * static_cast<int>(reps_.size()) < 2) return {};
    return sync_batch_norm_nodes(ex, begin, end);
  }

  void sync_batch_norm(const std::vector<Executor*>& ex, const std::vector<int64_t>& rows, int64_t global,
                       size_t node) {
    auto each_with_rows = [&](const std::function<void(size_t)>& f) {
      lanes_->run([&](int lane) {
        each_replica(lane, [&](size_t r) {
          if (rows[r] > 0) f(r);
        });
      });
    };
    parallel::sync_batch_norm(ex, rows, global, node, each_with_rows,
                              [&](std::vector<double>& v) { all_reduce_double(v); });
  }

  // Sums over every process of the group, in double precision: each value travels as a float and the float
  // remainder, so totals keep about 48 bits.
  void all_reduce_double(std::vector<double>& v) const {
    if (procs_ < 2) return;
    std::vector<float> parts(2 * v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      parts[2 * i] = static_cast<float>(v[i]);
      parts[2 * i + 1] = static_cast<float>(v[i] - static_cast<double>(parts[2 * i]));
    }
    o_.group->all_reduce_sum(parts);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(parts[2 * i]) + static_cast<double>(parts[2 * i + 1]);
  }

  // Records the end of replica r's backward compute (the reference for how much communication was hidden).
  void finish_backward(size_t r, Clock::time_point t0) {
    const auto t_end = Clock::now();
    stats_[r].compute += std::chrono::duration<double>(t_end - t0).count();
    lanes_->signal([&] { backward_end_ = backward_done_++ == 0 ? t_end : std::max(backward_end_, t_end); });
  }

  // Optimizer updates (ema = false) or the EMA updates that follow the weight broadcast (ema = true).
  void update(size_t r, Executor& ex, const StepScalars& s, bool ema) {
    const size_t upd = std::min(ex.first_node_of(Phase::update), ex.size());
    const size_t ema_at = sends_.empty() ? ex.size() : first_of_kind(ex.graph(), OpKind::EmaUpdate, upd);
    if (!ema) {
      stats_[r].wait += lanes_->wait([&] { return reduced_ == ready_.size(); });
      auto t0 = Clock::now();
      if (o_.sharded) shards_[r]->update(ex, s);
      ex.run_range(upd, ema_at, s, slot_[r]);
      reps_[r]->device().synchronize();
      stats_[r].compute += since(t0);
      lanes_->signal([&] { ++updated_; });
    } else if (ema_at < ex.size()) {
      stats_[r].wait += lanes_->wait([&] { return sent_; });
      auto t0 = Clock::now();
      ex.run_range(ema_at, ex.size(), s, slot_[r]);
      stats_[r].compute += since(t0);
    }
  }

  void reduce_and_send(const std::vector<Bucket>& bk) {
    const int n = static_cast<int>(reps_.size());
    std::vector<BufferView> views(reps_.size());
    std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;  // when each bucket's reduction ran
    for (size_t k = 0; k < bk.size(); ++k) {
      lanes_->wait([&] { return overlap_ ? ready_[k] == n : backward_done_ == n; });
      for (size_t r = 0; r < reps_.size(); ++r) views[r] = range_of(reps_[r]->state().region(Region::gradients), bk[k]);
      auto t0 = Clock::now();
      comm_->all_reduce_sum(views, devices_);
      spans.emplace_back(t0, Clock::now());
      comm_seconds_ += since(t0);
      lanes_->signal([&] { reduced_ = k + 1; });
    }
    // Exposed communication: the reduction work done after the last replica finished its backward pass (waking
    // threads is not counted; that is scheduling, not communication).
    Clock::time_point bwd_end;
    lanes_->wait([&] { return backward_done_ == n; });
    lanes_->signal([&] { bwd_end = backward_end_; });
    for (const auto& [a, b] : spans)
      exposed_seconds_ += std::max(0.0, std::chrono::duration<double>(b - std::max(a, bwd_end)).count());
    if (sends_.empty()) return;
    lanes_->wait([&] { return updated_ == n; });
    for (const auto& [sl, owner] : sends_) {
      for (size_t r = 0; r < reps_.size(); ++r) {
        const std::string& name = param_names_[sl.param];
        views[r] = sl.count < 0 ? reps_[r]->state().persistent(name)
                                : ShardedOptimizer::weight_slice(*layout_, reps_[r]->state(), sl);
      }
      comm_->broadcast(views, devices_, owner);
    }
    lanes_->signal([&] { sent_ = true; });
  }

  struct ReplicaStats {
    int64_t examples = 0, steps = 0;
    double compute = 0, wait = 0;
  };

  std::shared_ptr<void> keep_;  // first member: outlives everything allocated on its devices
  DataParallelOptions o_;
  RunnerContext ctx_;
  std::unique_ptr<Communicator> comm_;
  bool overlap_ = o_.overlap;
  bool mixed_ = false;  // replicas on more than one backend
  int procs_ = 1;       // processes in the group
  int first_ = 0;       // the global index of this process's replica 0
  std::vector<int> dev_;
  std::vector<int64_t> base_rows_;
  std::unique_ptr<ShardLayout> layout_;  // optimizer_state = "sharded"
  std::vector<std::unique_ptr<Replica>> reps_;
  std::vector<std::unique_ptr<ShardedOptimizer>> shards_;  // per replica, when sharded
  std::vector<Device*> devices_;
  std::vector<std::string> param_names_;
  std::vector<std::string> buffer_names_;  // non-trained persistent state (TensorRole::buffer)
  struct Send {
    ShardSlice slice;  // count < 0: the whole parameter
    int owner;
  };
  std::vector<Send> sends_;  // weights broadcast after each update, with their source
  std::map<const Executor*, std::vector<Bucket>> buckets_;
  std::vector<Element> parts_;
  // Batches handed to prefetch(), oldest first: their per-replica rows, which the uploads read until the step.
  struct Prefetched {
    const void* key = nullptr;   // the whole batch's feature storage
    std::vector<Element> parts;  // empty with one replica (the batch itself is uploaded)
  };
  std::deque<Prefetched> prefetched_;
  std::vector<int> slot_;  // the input slot each replica's executor reads in the current step
  // Buffers (batch norm's running statistics) are replica 0's, as PyTorch DDP's broadcast_buffers makes them: each
  // replica updates its own from its own batch while training; evaluation and checkpoints use replica 0's, sent to
  // the others first, those of other processes included (collective: every process calls it at the same point).
  void sync_buffers() {
    if (buffer_names_.empty() || (reps_.size() < 2 && procs_ < 2)) return;
    drain();
    std::vector<BufferView> views(reps_.size());
    for (const auto& name : buffer_names_) {
      for (size_t r = 0; r < reps_.size(); ++r) views[r] = reps_[r]->state().persistent(name);
      comm_->broadcast(views, devices_, 0);
    }
  }

  // Every process must hold the bits rank 0 saves: a checksum of its tensors is compared before anything is written.
  void check_same_state(const std::map<std::string, HostTensor>& state) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over names and values
    auto mix = [&](const void* p, size_t n) {
      for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
    };
    for (const auto& [name, t] : state)
      mix(name.data(), name.size()), mix(t.data.data(), t.data.size() * sizeof(float));
    std::vector<uint8_t> mine(sizeof h);
    std::memcpy(mine.data(), &h, sizeof h);
    const std::string host = o_.group->host();
    mine.insert(mine.end(), host.begin(), host.end());
    auto every = o_.group->all_gather(mine);
    for (size_t r = 1; r < every.size(); ++r)
      if (every[r].size() < sizeof h || std::memcmp(every[r].data(), every[0].data(), sizeof h) != 0)
        throw Error("data_parallel: rank " + std::to_string(r) + " (host " +
                    std::string(every[r].begin() + sizeof h, every[r].end()) +
                    ") holds different weights or optimizer "
                    "state than rank 0 (host " +
                    std::string(every[0].begin() + sizeof h, every[0].end()) +
                    "); the processes diverged and no state was saved");
  }

  // Evaluation across processes: losses summed, outputs concatenated in rank order (each process took its rows).
  void gather_eval(EvalResult& out) {
    o_.group->all_reduce_sum(out.losses);
    std::vector<uint8_t> mine;
    auto put = [&](const void* p, size_t bytes) {
      const auto* b = static_cast<const uint8_t*>(p);
      mine.insert(mine.end(), b, b + bytes);
    };
    for (const auto& t : out.outputs) {
      const uint64_t rank = t.shape.rank(), count = t.data.size();
      put(&rank, sizeof rank);
      for (int64_t d : t.shape.dims()) put(&d, sizeof d);
      put(&count, sizeof count);
      put(t.data.data(), count * sizeof(float));
    }
    auto every = o_.group->all_gather(mine);
    std::vector<std::vector<HostTensor>> per_head(out.outputs.size());
    for (const auto& bytes : every) {
      size_t at = 0;
      auto get = [&](void* p, size_t n) {
        if (at + n > bytes.size()) throw Error("data_parallel: a process sent a damaged evaluation result");
        std::memcpy(p, bytes.data() + at, n);
        at += n;
      };
      for (auto& head : per_head) {
        uint64_t rank = 0, count = 0;
        get(&rank, sizeof rank);
        std::vector<int64_t> dims(rank);
        for (auto& d : dims) get(&d, sizeof d);
        get(&count, sizeof count);
        HostTensor t;
        t.shape = Shape(std::move(dims));
        t.data.resize(count);
        get(t.data.data(), count * sizeof(float));
        if (count > 0) head.push_back(std::move(t));
      }
    }
    for (size_t i = 0; i < per_head.size(); ++i) out.outputs[i] = concat_rows(per_head[i]);
  }

  void drain() noexcept {
    for (auto& rep : reps_) rep->input().drain();
    prefetched_.clear();
  }
  std::unique_ptr<Lanes> lanes_;
  int comm_lane_ = -1;  // -1: a single replica, nothing to communicate
  // One step's progress, guarded by the lanes' lock.
  std::vector<int> ready_;
  size_t reduced_ = 0;
  int backward_done_ = 0, updated_ = 0;
  bool sent_ = false;
  Clock::time_point backward_end_;
  // Statistics since creation.
  std::vector<ReplicaStats> stats_;
  double comm_seconds_ = 0, exposed_seconds_ = 0, step_seconds_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Runner> make_data_parallel_runner(const DataParallelOptions& o, const RunnerContext& ctx,
                                                  std::unique_ptr<Communicator> comm, std::shared_ptr<void> keep) {
  return std::make_unique<DataParallelRunner>(o, ctx, std::move(comm), std::move(keep));
}

}  // namespace kiln::parallel
