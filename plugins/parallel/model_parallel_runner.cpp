// The model-parallel runner: one lane per device runs its segments of every micro-batch in order (GPipe: all
// forwards, then all backwards), pulling tensors from other devices once their producing segment is done.
#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>

#include "host_communicator.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "lanes.hpp"
#include "model_parallel.hpp"

namespace kiln::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class ModelParallelRunner final : public Runner {
 public:
  ModelParallelRunner(const ModelParallelOptions& o, const RunnerContext& ctx, Placement p, std::shared_ptr<void> keep)
      : keep_(std::move(keep)), o_(o), ctx_(ctx), p_(std::move(p)) {
    const size_t slots = p_.open_index.size();
    states_.resize(slots);
    stage_.resize(slots);
    busy_.assign(slots, 0.0);
    train_busy_.assign(slots, 0.0);
    std::vector<std::string> names;
    for (size_t s = 0; s < slots; ++s) {
      states_[s].push_back(std::make_unique<DeviceState>(dev_ctx(s), ctx_.seed));
      names.push_back("device " + device(s).info().label() + " (slot " + std::to_string(s) + ")");
    }
    // Lanes copy from other devices while those compute; only host-memory devices are known to allow that, so a
    // placement with other devices runs its segments in graph order on one thread.
    bool host_only = true;
    for (size_t s = 0; s < slots; ++s) host_only = host_only && device(s).info().host_addressable;
    if (o_.concurrent && host_only) lanes_ = std::make_unique<Lanes>(names);
    // Build every executor of a full step now, so the regions are sized once and nothing allocates mid-step.
    for (int m = 0; m < p_.micro_batches; ++m)
      for (size_t s = 0; s < slots; ++s) {
        exec(s, static_cast<size_t>(m), p_.micro_rows, true, false);
        exec(s, static_cast<size_t>(m), p_.micro_rows, false, false);
        if (ctx_.optimizer && ctx_.optimizer->ema_decay > 0)
          exec(s, static_cast<size_t>(m), p_.micro_rows, false, true);
      }
  }

  StepResult train_step(const Element& batch, const StepScalars& s) override {
    auto t0 = Clock::now();
    auto rows = micro_rows(batch.batch);
    auto parts = split(batch, rows);
    auto ex = executors(rows, true, false);
    auto progs = programs(rows, true, false);
    const Graph& g = built(rows[0], true, false).g;
    auto load = [&](size_t slot, size_t m) { ex[slot][m]->load_batch(*parts[m]); };
    const auto busy0 = busy_;
    const auto tp = Clock::now();
    phase(Phase::forward, in_order(rows.size(), false), ex, progs, s, load, nullptr);
    StepResult res;
    for (auto t : g.losses) {
      const size_t slot = static_cast<size_t>(g.tensor(t).device);
      double sum = 0;
      for (size_t m = 0; m < rows.size(); ++m)
        sum += double(ex[slot][m]->read_scalar(t)) * double(rows[m]) / double(batch.batch);
      res.losses.push_back(static_cast<float>(sum));
      res.total_loss += static_cast<float>(sum);
    }
    if (!std::isfinite(res.total_loss)) return res;  // no device changes its weights
    // GPipe: backward of the micro-batches in reverse, then (per device) accumulate and update.
    phase(Phase::backward, in_order(rows.size(), true), ex, progs, s, nullptr,
          [&](size_t slot) { accumulate(slot, ex, rows, batch.batch); });
    phase(Phase::update, {0}, ex, progs, s, nullptr, nullptr);
    phase_seconds_ += since(tp);
    for (size_t d = 0; d < busy_.size(); ++d) train_busy_[d] += busy_[d] - busy0[d];
    ++steps_;
    examples_ += batch.batch;
    step_seconds_ += since(t0);
    return res;
  }

  EvalResult eval_batch(const Element& batch, bool use_ema) override {
    auto rows = micro_rows(batch.batch);
    auto parts = split(batch, rows);
    auto ex = executors(rows, false, use_ema);
    auto progs = programs(rows, false, use_ema);
    const Graph& g = built(rows[0], false, use_ema).g;
    auto load = [&](size_t slot, size_t m) { ex[slot][m]->load_batch(*parts[m]); };
    phase(Phase::forward, in_order(rows.size(), false), ex, progs, {}, load, nullptr);
    EvalResult r;
    for (size_t i = 0; i < g.losses.size(); ++i) {
      const size_t ls = static_cast<size_t>(g.tensor(g.losses[i]).device),
                   os = static_cast<size_t>(g.tensor(g.outputs[i]).device);
      float sum = 0;
      std::vector<HostTensor> outs;
      for (size_t m = 0; m < rows.size(); ++m) {
        sum += ex[ls][m]->read_scalar(g.losses[i]) * static_cast<float>(rows[m]);
        outs.push_back(ex[os][m]->read(g.outputs[i]));
      }
      r.losses.push_back(sum);
      r.outputs.push_back(concat_rows(outs));
    }
    return r;
  }

  std::map<std::string, HostTensor> save_state() override {
    std::map<std::string, HostTensor> all;
    for (auto& st : states_)
      for (auto& [name, t] : st[0]->read_all()) all.emplace(name, std::move(t));
    return all;
  }

  void load_state(const std::map<std::string, HostTensor>& st) override {
    for (const auto& [name, t] : st) {
      bool found = false;
      for (auto& s : states_)
        if (s[0]->has(name)) s[0]->write(name, t), found = true;
      if (!found) throw Error("checkpoint tensor '" + name + "' does not exist in this model");
    }
  }

  // One forward pass over the whole batch on micro-batch state 0, run in graph order, keeping every layer output.
  std::string find_nonfinite_layer(const Element& batch, int64_t step) override {
    const size_t slots = states_.size();
    Graph g = placed_graph(ctx_, p_, batch.batch, true, false);
    Program prog = make_program(g, static_cast<int>(slots));
    std::vector<std::unique_ptr<Executor>> ex;
    for (size_t s = 0; s < slots; ++s) {
      PlanOptions po;
      po.device = static_cast<int>(s);
      po.keep_alive = prog.keep_alive[s];
      for (const auto& l : g.layer_outputs) po.keep_alive.push_back(l.out);
      ex.push_back(std::make_unique<Executor>(g, *states_[s][0], po));
      ex.back()->load_batch(batch);
    }
    StepScalars sc;
    sc.step = step;
    for (const auto& seg : prog.segments) {  // graph order: every producer runs before its readers
      if (seg.phase != Phase::forward) continue;
      for (auto t : seg.pulls)
        pull(prog.transfers[t], *ex[static_cast<size_t>(prog.transfers[t].src)], *ex[static_cast<size_t>(seg.slot)],
             stage_[0]);
      ex[static_cast<size_t>(seg.slot)]->run_range(seg.call_begin, seg.call_end, sc);
    }
    for (const auto& l : g.layer_outputs) {
      HostTensor h = ex[static_cast<size_t>(g.tensor(l.out).device)]->read(l.out);
      for (float v : h.data)
        if (!std::isfinite(v))
          return l.name + " (" + l.type + ") on " + device(static_cast<size_t>(g.tensor(l.out).device)).info().label();
    }
    return {};
  }

  std::vector<DevicePlan> plan() const override { return plan_model_parallel(ctx_, p_, true); }

  std::string report() const override {
    std::ostringstream os;
    os << "model_parallel: " << states_.size() << " device(s), " << p_.micro_batches << " micro-batch(es) of "
       << p_.micro_rows << " rows" << (lanes_ ? "" : ", devices run one after another") << "\n";
    for (const auto& d : plan())
      for (const auto& n : d.notes) os << "  " << d.device << ": " << n << "\n";
    if (steps_ > 0) {
      double busy = 0;
      int active = 0;
      for (double b : train_busy_)
        if (b > 0) busy += b, ++active;
      double idle =
          phase_seconds_ > 0 && active > 0 ? std::clamp(1.0 - busy / (active * phase_seconds_), 0.0, 1.0) : 0.0;
      os << std::fixed << std::setprecision(0) << "  total: " << double(examples_) / step_seconds_ << " examples/s, "
         << std::setprecision(4) << step_seconds_ / double(steps_)
         << " s/batch; measured bubble (device idle share of the step) " << std::setprecision(3) << idle << "\n";
    }
    return os.str();
  }

 private:
  struct Built {
    Graph g;
    Program prog;
  };
  using ExecGrid = std::vector<std::vector<Executor*>>;  // [slot][micro]

  DeviceContext dev_ctx(size_t slot) const { return ctx_.devices.at(static_cast<size_t>(p_.open_index[slot])); }
  Device& device(size_t slot) const { return *dev_ctx(slot).device; }

  std::vector<int64_t> micro_rows(int64_t n) const {
    return split_rows(n, static_cast<int>(std::min<int64_t>(p_.micro_batches, n)));
  }

  std::vector<const Element*> split(const Element& b, const std::vector<int64_t>& rows) {
    std::vector<const Element*> out;
    if (rows.size() == 1) return {&b};
    parts_.clear();
    parts_.reserve(rows.size());
    int64_t at = 0;
    for (auto n : rows) parts_.push_back(slice_rows(b, at, n)), at += n;
    for (auto& p : parts_) out.push_back(&p);
    return out;
  }

  const Built& built(int64_t rows, bool training, bool ema) {
    auto key = std::make_tuple(rows, training, ema);
    auto it = built_.find(key);
    if (it != built_.end()) return it->second;
    Built b;
    b.g = placed_graph(ctx_, p_, rows, training, ema);
    b.prog = make_program(b.g, static_cast<int>(states_.size()));
    return built_.emplace(key, std::move(b)).first->second;
  }

  DeviceState& state(size_t slot, size_t micro) {
    auto& v = states_[slot];
    while (v.size() <= micro) v.push_back(std::make_unique<DeviceState>(*v[0]));
    return *v[micro];
  }

  Executor& exec(size_t slot, size_t micro, int64_t rows, bool training, bool ema) {
    auto key = std::make_tuple(slot, micro, rows, training, ema);
    auto it = execs_.find(key);
    if (it != execs_.end()) return *it->second;
    const Built& b = built(rows, training, ema);
    PlanOptions po;
    po.device = static_cast<int>(slot);
    po.keep_alive = b.prog.keep_alive[slot];
    auto ex = std::make_unique<Executor>(b.g, state(slot, micro), po);
    return *execs_.emplace(key, std::move(ex)).first->second;
  }

  ExecGrid executors(const std::vector<int64_t>& rows, bool training, bool ema) {
    ExecGrid ex(states_.size(), std::vector<Executor*>(rows.size()));
    for (size_t s = 0; s < states_.size(); ++s)
      for (size_t m = 0; m < rows.size(); ++m) ex[s][m] = &exec(s, m, rows[m], training, ema);
    return ex;
  }

  void pull(const Transfer& t, Executor& from, Executor& to, std::vector<float>& stage) {
    copy_between(device(static_cast<size_t>(t.src)), from.view(t.root), device(static_cast<size_t>(t.dst)),
                 to.view(t.root), stage);
  }

  // Runs segment `si` of micro-batch m: waits for the segments that wrote its inputs elsewhere (with lanes; run
  // in graph order they are done already), copies those inputs in, then runs its ops.
  void segment(size_t si, size_t m, ExecGrid& ex, const Program& prog, const StepScalars& s) {
    const Segment& seg = prog.segments[si];
    const size_t slot = static_cast<size_t>(seg.slot);
    for (auto t : seg.pulls) {
      const Transfer& tr = prog.transfers[t];
      if (lanes_)
        lanes_->wait([&] { return done_[m][tr.producer] != 0; });
      else if (!done_[m][tr.producer])
        throw Error("model_parallel: segment order broken (a producer has not run)");
      auto t0 = Clock::now();
      pull(tr, *ex[static_cast<size_t>(tr.src)][m], *ex[slot][m], stage_[slot]);
      busy_[slot] += since(t0);
    }
    auto t0 = Clock::now();
    ex[slot][m]->run_range(seg.call_begin, seg.call_end, s);
    device(slot).synchronize();
    busy_[slot] += since(t0);
    if (lanes_)
      lanes_->signal([&] { done_[m][si] = 1; });
    else
      done_[m][si] = 1;
  }

  // Every segment of `phase` for the micro-batches in `order`: per device on its lane, or all in graph order.
  void phase(Phase ph, const std::vector<size_t>& order, ExecGrid& ex, const std::vector<const Program*>& progs,
             const StepScalars& s, const std::function<void(size_t slot, size_t m)>& before,
             const std::function<void(size_t slot)>& after) {
    auto on_slot = [&](size_t slot) {
      for (size_t m : order) {
        if (before) before(slot, m);
        const Program& prog = *progs[m];
        for (size_t si = 0; si < prog.segments.size(); ++si)
          if (static_cast<size_t>(prog.segments[si].slot) == slot && prog.segments[si].phase == ph)
            segment(si, m, ex, prog, s);
      }
      if (after) after(slot);
    };
    if (lanes_) return lanes_->run([&](int slot) { on_slot(static_cast<size_t>(slot)); });
    size_t slot = 0;  // graph order on this thread; errors name the device like the lanes do
    try {
      for (size_t m : order) {
        for (slot = 0; slot < states_.size() && before; ++slot) before(slot, m);
        const Program& prog = *progs[m];
        for (size_t si = 0; si < prog.segments.size(); ++si)
          if (prog.segments[si].phase == ph)
            slot = static_cast<size_t>(prog.segments[si].slot), segment(si, m, ex, prog, s);
      }
      for (slot = 0; slot < states_.size() && after; ++slot) after(slot);
    } catch (...) {
      rethrow_with_prefix(std::current_exception(),
                          "device " + device(std::min(slot, states_.size() - 1)).info().label() + " (slot " +
                              std::to_string(std::min(slot, states_.size() - 1)) + ") failed: ");
    }
  }

  std::vector<const Program*> programs(const std::vector<int64_t>& rows, bool training, bool ema) {
    std::vector<const Program*> out;
    for (auto r : rows) out.push_back(&built(r, training, ema).prog);
    done_.assign(rows.size(), std::vector<uint8_t>(out[0]->segments.size(), 0));
    return out;
  }

  static std::vector<size_t> in_order(size_t n, bool reverse) {
    std::vector<size_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = reverse ? n - 1 - i : i;
    return v;
  }

  // The whole batch's gradient = the micro-batches' gradients weighted by share, summed into micro-batch 0's.
  void accumulate(size_t slot, ExecGrid& ex, const std::vector<int64_t>& rows, int64_t total) {
    const size_t bytes = ex[slot][0]->plan().gradients;
    if (rows.size() < 2 || bytes == 0) return;
    auto t0 = Clock::now();
    auto grads = [&](size_t m) {
      BufferView v = state(slot, m).region(Region::gradients);
      v.bytes = bytes;
      return v;
    };
    const auto count = static_cast<int64_t>(bytes / sizeof(float));
    OpCall c;
    c.kind = OpKind::Scale;
    c.attrs = ElementwiseAttrs{count, float(double(rows[0]) / double(total)), 0.f};
    c.in = {grads(0)};
    c.out = {grads(0)};
    device(slot).run(c);
    c.kind = OpKind::Axpby;
    for (size_t m = 1; m < rows.size(); ++m) {
      c.attrs = ElementwiseAttrs{count, float(double(rows[m]) / double(total)), 1.f};
      c.in = {grads(m)};
      device(slot).run(c);
    }
    device(slot).synchronize();
    busy_[slot] += since(t0);
  }

  std::shared_ptr<void> keep_;  // first member: outlives everything allocated on its devices
  ModelParallelOptions o_;
  RunnerContext ctx_;
  Placement p_;
  std::vector<std::vector<std::unique_ptr<DeviceState>>> states_;  // [slot][micro]; micro >= 1 share micro 0's weights
  std::map<std::tuple<int64_t, bool, bool>, Built> built_;
  std::map<std::tuple<size_t, size_t, int64_t, bool, bool>, std::unique_ptr<Executor>> execs_;
  std::unique_ptr<Lanes> lanes_;
  std::vector<std::vector<float>> stage_;
  std::vector<Element> parts_;
  std::vector<std::vector<uint8_t>> done_;  // [micro][segment], guarded by the lanes' lock
  std::vector<double> busy_, train_busy_;   // per device: seconds running ops and copies (all, and in training)
  double phase_seconds_ = 0, step_seconds_ = 0;
  int64_t steps_ = 0, examples_ = 0;
};

}  // namespace

std::unique_ptr<Runner> make_model_parallel_runner(const ModelParallelOptions& o, const RunnerContext& ctx, Placement p,
                                                   std::shared_ptr<void> keep) {
  return std::make_unique<ModelParallelRunner>(o, ctx, std::move(p), std::move(keep));
}

}  // namespace kiln::parallel
