// Helpers for the parallel-strategy tests: logical CPU devices, models and strategies from TOML, random batches,
// and comparisons of saved states.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/model.hpp"
#include "kiln/plugin.hpp"
#include "kiln/strategy.hpp"
#include "test_support.hpp"

namespace kiln::test::par {

using kiln::test::model_from;
using kiln::test::random_batch;

inline OptimizerSpec optimizer_from(const std::string& toml) {
  auto cfg = Config::load_string(toml, "optimizer.toml");
  return parse_optimizer(*cfg.root().table("optimizer"));
}

// `n` logical devices of the real cpu backend (one thread each, so several replicas share the cores fairly).
struct CpuDevices {
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<std::unique_ptr<Allocator>> allocs;
  explicit CpuDevices(int n, size_t limit = 0) {
    auto backend =
        registry().backend("cpu")(BackendOptions::parse("virtual_devices = " + std::to_string(n) + "\nthreads = 1"));
    for (int i = 0; i < n; ++i) {
      devs.push_back(backend->open(i));
      AllocatorOptions ao;
      ao.limit = limit ? limit : devs.back()->info().total_memory;
      allocs.push_back(std::make_unique<Allocator>(*devs.back(), ao));
    }
  }
  std::vector<DeviceContext> ctx(int first = 0, int count = -1) const {
    std::vector<DeviceContext> out;
    if (count < 0) count = static_cast<int>(devs.size()) - first;
    for (int i = first; i < first + count; ++i) out.push_back({devs[size_t(i)].get(), allocs[size_t(i)].get()});
    return out;
  }
};

inline RunnerContext context(const ModelSpec& m, const OptimizerSpec& o, std::vector<DeviceContext> devices,
                             int64_t batch, uint32_t seed = 11) {
  RunnerContext c;
  c.model = &m;
  c.optimizer = &o;
  c.devices = std::move(devices);
  c.global_batch = batch;
  c.seed = seed;
  return c;
}

// A strategy built by its registered factory from a `[strategy]` table, as the Session does.
inline std::unique_ptr<Strategy> strategy(const std::string& strategy_toml) {
  auto cfg = Config::load_string(strategy_toml, "strategy.toml");
  auto s = cfg.root().table("strategy");
  auto type = s->get_string("type");
  return registry().strategy(type)(*s);
}

// Largest |a - b| over every tensor of two saved states (which must hold the same names and shapes).
inline double max_abs_diff(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape != t.shape) return INFINITY;
    for (size_t i = 0; i < t.data.size(); ++i)
      worst = std::max(worst, double(std::fabs(t.data[i] - it->second.data[i])));
  }
  return worst;
}

// Trains `steps` steps on deterministic random batches and returns the saved state.
inline std::map<std::string, HostTensor> train(Runner& r, const ModelSpec& m, int64_t batch, int steps, int64_t classes,
                                               std::vector<float>* losses = nullptr) {
  for (int s = 0; s < steps; ++s) {
    auto b = random_batch(batch, m.input_shape, classes, 100u + uint32_t(s));
    auto res = r.train_step(b, {s, 0.05f});
    if (losses) losses->push_back(res.total_loss);
  }
  return r.save_state();
}

// The same training on one logical CPU device with the single strategy: the reference data-parallel runs are
// compared with.
inline std::map<std::string, HostTensor> single_device(const ModelSpec& m, const OptimizerSpec& o, int64_t batch,
                                                       int steps, std::vector<float>* losses = nullptr) {
  CpuDevices one(1);
  auto r = strategy("[strategy]\ntype = \"single\"\n")->create(context(m, o, one.ctx(), batch));
  return train(*r, m, batch, steps, 3, losses);
}

// Fault injection around a real CPU device: every call goes to the device, and run() number `fail_at` throws the
// DeviceError a failing driver call would.
class FailingDevice final : public Device {
 public:
  explicit FailingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  void fail_after(int runs) { fail_at_ = runs_ + runs; }
  const DeviceInfo& info() const override { return inner_->info(); }
  Block* allocate_block(size_t bytes) override { return inner_->allocate_block(bytes); }
  void free_block(Block* b) noexcept override { inner_->free_block(b); }
  size_t workspace_bytes(const OpCall& c) const override { return inner_->workspace_bytes(c); }
  void synchronize() override { inner_->synchronize(); }

 protected:
  void do_copy_from_host(const void* src, const BufferView& dst) override { inner_->copy_from_host(src, dst); }
  void do_copy_to_host(const BufferView& src, void* dst) override { inner_->copy_to_host(src, dst); }
  void do_copy_on_device(const BufferView& src, const BufferView& dst) override { inner_->copy_on_device(src, dst); }
  // The inner device's supports() decides (its backend is this one's: info() is the inner device's).
  bool runs_kernel(const Kernel&) const override { return true; }
  Support do_supports(OpKind kind, const OpAttrs& attrs, const OpArity&, const Kernel&) const override {
    return inner_->supports(kind, attrs);
  }
  bool do_run(const OpCall& c) override {
    if (++runs_ == fail_at_)
      throw DeviceError(info().label() + " op " + std::string(op_name(c.kind)) + ": injected launch failure");
    inner_->run(c);
    return true;
  }

 private:
  std::unique_ptr<Device> inner_;
  int runs_ = 0, fail_at_ = -1;
};

// Wraps device `i` of `d` (before anything is allocated on it) so failures can be injected.
inline FailingDevice* wrap_failing(CpuDevices& d, size_t i) {
  auto* f = new FailingDevice(std::move(d.devs[i]));
  d.devs[i].reset(f);
  d.allocs[i] = std::make_unique<Allocator>(*f, AllocatorOptions{});
  return f;
}

}  // namespace kiln::test::par
