// The built-in `single` strategy: the whole model on one device.
#include <cmath>
#include <map>
#include <tuple>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "kiln/single_runner.hpp"

namespace kiln {

SingleDeviceRunner::SingleDeviceRunner(const RunnerContext& ctx, int device_index)
    : ctx_(ctx),
      dctx_(ctx.devices.at(static_cast<size_t>(device_index))),
      state_(dctx_, ctx.seed),
      input_(state_, std::max(1, ctx.input_slots)) {}

SingleDeviceRunner::~SingleDeviceRunner() { input_.drain(); }

void SingleDeviceRunner::prefetch(const Element& next) {
  if (input_.slots() < 2 || next.x.data.empty()) return;
  // A new executor may move the shared regions: nothing may be in flight into them then.
  if (!execs_.count(std::make_tuple(next.batch, true, false))) input_.drain();
  input_.prefetch(executor(next.batch, true, false), next, next.x.data.data());
}

Executor& SingleDeviceRunner::executor(int64_t batch, bool training, bool ema) {
  auto key = std::make_tuple(batch, training, ema);
  auto it = execs_.find(key);
  if (it != execs_.end()) return *it->second;
  GraphOptions o;
  o.batch = batch;
  o.training = training;
  o.use_ema = ema;
  o.optimizer = ctx_.optimizer;
  PlanOptions po;
  po.input_slots = training ? std::max(1, ctx_.input_slots) : 1;
  auto ex = std::make_unique<Executor>(build_graph(*ctx_.model, o), state_, po);
  return *execs_.emplace(key, std::move(ex)).first->second;
}

void SingleDeviceRunner::prepare(int64_t batch) {
  // Build the largest graphs first so the shared regions are sized once.
  executor(batch, true, false);
  executor(batch, false, false);
  if (ctx_.optimizer && ctx_.optimizer->ema_decay > 0) executor(batch, false, true);
}

StepResult SingleDeviceRunner::train_step(const Element& batch, const StepScalars& s) {
  Executor& ex = executor(batch.batch, true, false);
  Device* dev = dctx_.device;
  // The batch's input slot: uploaded by prefetch() while the previous step ran, or copied now.
  const int slot = input_.acquire(ex, batch, batch.x.data.data());
  // The same executor with the same bound buffers is the same op sequence: a backend may record it once and replay
  // it (CUDA graphs); a new generation of the regions, or the other input slot, means new buffers, hence a new id.
  const uint64_t seq = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&ex)) ^ (state_.generation() << 48) ^
                       (static_cast<uint64_t>(slot) << 40);
  struct SequenceScope {
    Device* d;
    ~SequenceScope() { d->end_sequence(); }
  } scope{dev};
  dev->begin_sequence(seq);
  // Forward and losses first: a non-finite loss stops the step before any weight changes.
  size_t bwd = ex.first_node_of(Phase::backward);
  ex.run_range(0, bwd, s, slot);
  StepResult r;
  for (auto t : ex.graph().losses) {
    float v = ex.read_scalar(t) / s.loss_scale;  // the scaled loss of float16's loss scaling, unscaled
    r.losses.push_back(v);
    r.total_loss += v;
  }
  if (!std::isfinite(r.total_loss)) return r;
  if (ex.graph().loss_scaling) {  // GradScaler.step: no update from a non-finite gradient
    const size_t upd = ex.first_node_of(Phase::update);
    ex.run_range(bwd, upd, s, slot);
    const float sq = ex.read_scalar(ex.graph().grad_sq);
    r.grad_norm = std::sqrt(sq);
    if (!std::isfinite(sq)) {
      r.skipped = true;
      return r;
    }
    ex.run_range(upd, ex.size(), s, slot);
    return r;
  }
  ex.run_range(bwd, ex.size(), s, slot);
  if (ex.graph().grad_sq != kNoTensor) r.grad_norm = std::sqrt(ex.read_scalar(ex.graph().grad_sq));
  return r;
}

EvalResult SingleDeviceRunner::eval_batch(const Element& batch, bool use_ema) {
  input_.drain();  // evaluation reads input slot 0
  Executor& ex = executor(batch.batch, false, use_ema);
  ex.load_batch(batch);
  ex.run({});
  EvalResult r;
  for (size_t i = 0; i < ex.graph().losses.size(); ++i) {
    r.losses.push_back(ex.read_scalar(ex.graph().losses[i]) * static_cast<float>(batch.batch));
    r.outputs.push_back(ex.read(ex.graph().outputs[i]));
  }
  return r;
}

std::map<std::string, HostTensor> SingleDeviceRunner::save_state() { return state_.read_all(); }

void SingleDeviceRunner::load_state(const std::map<std::string, HostTensor>& st) {
  for (const auto& [name, t] : st) state_.write(name, t);
}

std::span<float> SingleDeviceRunner::host_view(const std::string& name) {
  Device* dev = dctx_.device;
  if (!dev->info().host_addressable || !state_.has(name)) return {};
  const BufferView& v = state_.persistent(name);
  // Persistent tensors are stored as float32 (graph.hpp); other storage would not hold the bits save_state() gives.
  if (v.dtype != DType::f32 || v.bytes % sizeof(float) != 0) return {};
  input_.drain();
  dev->synchronize();  // the caller reads and writes it directly: no op may still use it
  return {v.host(), v.bytes / sizeof(float)};
}

std::string SingleDeviceRunner::find_nonfinite_layer(const Element& batch, int64_t step) {
  input_.drain();
  GraphOptions o;
  o.batch = batch.batch;
  o.training = true;
  o.optimizer = ctx_.optimizer;
  return first_nonfinite_layer(build_graph(*ctx_.model, o), state_, batch, step);
}

std::vector<DevicePlan> SingleDeviceRunner::plan_for(const RunnerContext& ctx, int device_index) {
  Device* dev = ctx.devices.empty() ? nullptr : ctx.devices.at(static_cast<size_t>(device_index)).device;
  GraphOptions o;
  o.batch = ctx.global_batch;
  o.training = true;
  o.optimizer = ctx.optimizer;
  Graph train = build_graph(*ctx.model, o);
  o.training = false;
  Graph eval = build_graph(*ctx.model, o);
  PlanOptions po;
  po.input_slots = std::max(1, ctx.input_slots);
  MemoryPlan pt = plan_memory(train, dev, po), pe = plan_memory(eval, dev);
  pt.arena = std::max(pt.arena, pe.arena);
  pt.workspace = std::max(pt.workspace, pe.workspace);
  pt.input = std::max(pt.input, pe.input);
  DevicePlan d = pt.summary(dev ? dev->info().label() : "device 0");
  if (po.input_slots > 1)
    d.notes.push_back("input buffers: " + std::to_string(po.input_slots) +
                      " batches ([train] device_prefetch: the next batch is copied in while the step runs)");
  return {d};
}

namespace {

class SingleStrategy : public Strategy {
 public:
  // The device is the first of [device] visible after `select`; the strategy itself has no keys.
  explicit SingleStrategy(const ConfigNode& c) { c.finish(); }
  std::string name() const override { return "single"; }
  std::vector<DevicePlan> plan(const RunnerContext& ctx) const override {
    check(ctx);
    return SingleDeviceRunner::plan_for(ctx, device_);
  }
  std::unique_ptr<Runner> create(const RunnerContext& ctx) override {
    check(ctx);
    auto r = std::make_unique<SingleDeviceRunner>(ctx, device_);
    r->prepare(ctx.global_batch);
    return r;
  }

 private:
  void check(const RunnerContext& ctx) const {
    if (ctx.devices.empty()) throw Error("strategy single: no device was opened");
  }
  int device_ = 0;
};

}  // namespace

void register_builtin_strategies(Registry& reg) {
  reg.add_strategy(
      "single", [](const ConfigNode& c) -> std::unique_ptr<Strategy> { return std::make_unique<SingleStrategy>(c); });
}

}  // namespace kiln
