// Device state (persistent tensors, shared regions) and the executor that runs a bound graph.
#include "kiln/executor.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "init_random.hpp"
#include "kiln/error.hpp"
#include "kiln/half.hpp"
#include "kiln/op_table.hpp"

namespace kiln {

namespace {

uint64_t name_hash(const std::string& s, uint32_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Initial values of one persistent tensor: a stream of its own (mt19937_64 seeded by the run seed and the tensor's
// name; uniform and normal draws as libstdc++ makes them, see init_random.hpp), so tensors can be filled in any
// order and on any thread with the same result.
void fill_initial(const TensorInfo& t, uint32_t seed, float* out) {
  const Init& in = t.init;
  const int64_t n = t.shape.numel();
  detail::Mt19937_64 rng(name_hash(t.name, seed));
  switch (in.kind) {
    case InitKind::zeros:
      std::fill(out, out + n, 0.f);
      break;
    case InitKind::ones:
      std::fill(out, out + n, 1.f);
      break;
    case InitKind::constant:
      std::fill(out, out + n, in.value);
      break;
    case InitKind::glorot_uniform: {
      double limit = std::sqrt(6.0 / static_cast<double>(std::max<int64_t>(in.fan_in + in.fan_out, 1)));
      detail::fill_uniform(out, n, rng, -limit, limit);
      break;
    }
    case InitKind::normal:
      detail::fill_normal(out, n, rng, static_cast<double>(in.value));
      break;
    case InitKind::he_normal:
      detail::fill_normal(out, n, rng, std::sqrt(2.0 / static_cast<double>(std::max<int64_t>(in.fan_in, 1))));
      break;
  }
}

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads, largest work first (weights[i] is task i's
// size); rethrows the first exception on the calling thread.
template <class Fn>
void parallel_tasks(const std::vector<int64_t>& weights, Fn&& fn) {
  const size_t n = weights.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weights[a] > weights[b]; });
  int64_t total = 0;
  for (int64_t w : weights) total += w;
  // Small models: threads cost more than they save.
  size_t threads = total < (int64_t{1} << 20) ? 1 : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, n);
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < n;) {
      try {
        fn(order[k]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

void DeviceState::ensure_persistent(const Graph& g, int device_index) {
  if (owner_) return owner_->ensure_persistent(g, device_index);
  // Parameters first: EMA shadows start as copies of them. Storage is allocated in graph order on this thread;
  // the values, each tensor a stream of its own, are computed on every core.
  const bool direct = ctx_.device->info().host_addressable;
  std::mutex copy_mu;  // copy_from_host is called from one thread at a time
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<const TensorInfo*> fill;
    std::vector<Entry*> target;
    std::vector<std::pair<const Entry*, const Entry*>> copies;  // EMA shadow <- its tensor, after the values exist
    for (const auto& t : g.tensors()) {
      if (t.alias_of != kNoTensor || !role_persistent(t.role) || t.device != device_index) continue;
      bool is_param = t.role == TensorRole::parameter;
      if ((pass == 0) != is_param || persistent_.count(t.name)) continue;
      Entry e;
      e.shape = t.shape;
      e.mem = ctx_.allocator->allocate(t.bytes(), AllocationSite{role_tag(t.role), "layer " + t.layer + " " + t.name});
      const std::string suffix = "/ema";
      if (t.role == TensorRole::ema && t.name.size() > suffix.size() &&
          persistent_.count(t.name.substr(0, t.name.size() - suffix.size()))) {
        const Entry* src = &persistent_.at(t.name.substr(0, t.name.size() - suffix.size()));
        copies.emplace_back(&persistent_.emplace(t.name, std::move(e)).first->second, src);
      } else {
        fill.push_back(&t);
        target.push_back(&persistent_.emplace(t.name, std::move(e)).first->second);
      }
    }
    std::vector<int64_t> sizes;
    for (const TensorInfo* t : fill) sizes.push_back(t->shape.numel());
    parallel_tasks(sizes, [&](size_t i) {
      if (direct) return fill_initial(*fill[i], seed_, target[i]->mem.view().host());
      HostTensor h(fill[i]->shape);
      fill_initial(*fill[i], seed_, h.data.data());
      std::lock_guard<std::mutex> lock(copy_mu);
      ctx_.device->copy_from_host(h.data.data(), target[i]->mem.view());
    });
    for (auto& [dst, src] : copies) ctx_.device->copy_on_device(src->mem.view(), dst->mem.view());
  }
}

void DeviceState::reserve_regions(const MemoryPlan& p) {
  auto grow = [&](Allocation& a, size_t bytes, MemoryTag tag, const char* what) {
    if (bytes == 0 || (a && a.bytes() >= bytes)) return;
    ctx_.device->synchronize();  // nothing may still use the old region
    a.reset();
    a = ctx_.allocator->allocate(bytes, AllocationSite{tag, what});
    ++generation_;
  };
  grow(gradients_, p.gradients, MemoryTag::gradients, "parameter gradients");
  grow(arena_, p.arena, MemoryTag::activations, "activation arena");
  grow(input_, p.input, MemoryTag::input_data, "input batch");
  if (owner_) {  // one op runs at a time on a device: micro-batch states share the owner's workspace
    MemoryPlan w;
    w.workspace = p.workspace;
    owner_->reserve_regions(w);
  } else {
    grow(workspace_, p.workspace, MemoryTag::workspace, "op workspace");
  }
}

const BufferView& DeviceState::persistent(const std::string& name) const {
  if (owner_) return owner_->persistent(name);
  auto it = persistent_.find(name);
  if (it == persistent_.end())
    throw Error("no persistent tensor named '" + name + "' on " + ctx_.device->info().label());
  return it->second.mem.view();
}

BufferView DeviceState::region(Region r) const {
  switch (r) {
    case Region::gradients:
      return gradients_.view();
    case Region::arena:
      return arena_.view();
    case Region::input:
      return input_.view();
    case Region::workspace:
      return owner_ ? owner_->region(r) : workspace_.view();
    default:
      return {};
  }
}

std::map<std::string, HostTensor> DeviceState::read_all() {
  if (owner_) return owner_->read_all();
  std::map<std::string, HostTensor> out;
  for (auto& [name, e] : persistent_) {
    HostTensor h(e.shape);
    ctx_.device->copy_to_host(e.mem.view(), h.data.data());
    out.emplace(name, std::move(h));
  }
  return out;
}

void DeviceState::write(const std::string& name, const HostTensor& t) {
  if (owner_) return owner_->write(name, t);
  auto it = persistent_.find(name);
  if (it == persistent_.end()) throw Error("checkpoint tensor '" + name + "' does not exist in this model");
  if (it->second.shape != t.shape)
    throw Error("checkpoint tensor '" + name + "' has shape " + t.shape.str() + ", the model has " +
                it->second.shape.str());
  ctx_.device->copy_from_host(t.data.data(), it->second.mem.view());
}

Executor::Executor(Graph g, DeviceState& state, const PlanOptions& o) : g_(std::move(g)), state_(state), opts_(o) {
  Device* dev = state_.context().device;
  for (const auto& t : g_.tensors())
    if (t.device == opts_.device && t.dtype != DType::f32)
      if (Support s = dev->supports_dtype(t.dtype); !s.yes)
        throw DeviceError("layer '" + t.layer + "' stores " + dtype_name(t.dtype) + " on " + dev->info().label() +
                          ": " + s.reason);
  plan_ = plan_memory(g_, dev, opts_);
  for (size_t i = 0; i < g_.nodes().size(); ++i) {
    const Node& n = g_.nodes()[i];
    if (n.device != opts_.device) continue;
    Support s = dev->supports(n.kind, n.attrs);
    if (!s.yes)
      throw DeviceError("layer '" + n.layer + "': op " + std::string(op_name(n.kind)) + " is not supported on " +
                        dev->info().label() + ": " + s.reason);
    node_index_.push_back(i);
  }
  state_.ensure_persistent(g_, opts_.device);
  state_.reserve_regions(plan_);
  bind();
}

BufferView Executor::view(TensorId t, int slot) const {
  const auto& ti = g_.tensor(t);
  auto r = static_cast<size_t>(g_.root(t));
  Region reg = plan_.region[static_cast<size_t>(t)];
  BufferView v;
  if (reg == Region::persistent) {
    v = state_.persistent(g_.tensor(static_cast<TensorId>(r)).name);
  } else if (reg == Region::none) {
    throw Error("tensor of layer '" + ti.layer + "' has no storage on device " + std::to_string(opts_.device));
  } else {
    BufferView base = state_.region(reg);
    v.block = base.block;
    v.offset = base.offset + plan_.offset[r] + (reg == Region::input ? static_cast<size_t>(slot) * input_stride_ : 0);
  }
  v.bytes = ti.bytes();
  v.dtype = ti.dtype;
  return v;
}

void Executor::bind() {
  // Input slots split the shared input region evenly, so executors of different batch sizes on one DeviceState
  // (a smaller last batch) agree on where each slot lives: a batch uploaded for one is never under another's slot.
  const size_t slots = static_cast<size_t>(std::max(1, opts_.input_slots));
  input_stride_ = state_.region(Region::input).bytes / slots / opts_.alignment * opts_.alignment;
  if (slots > 1 && input_stride_ < plan_.input_slot)
    throw Error("executor: the input region (" + std::to_string(state_.region(Region::input).bytes) +
                " bytes) is too small for " + std::to_string(slots) + " slots of " + std::to_string(plan_.input_slot) +
                " bytes");
  calls_.assign(slots, {});
  BufferView ws = state_.region(Region::workspace);
  Device* dev = state_.context().device;
  for (size_t slot = 0; slot < calls_.size(); ++slot)
    for (size_t i : node_index_) {
      const Node& n = g_.nodes()[i];
      OpCall c;
      c.kind = n.kind;
      c.attrs = n.attrs;
      for (auto t : n.in) c.in.push_back(view(t, static_cast<int>(slot)));
      for (auto t : n.out) c.out.push_back(view(t, static_cast<int>(slot)));
      c.workspace = ws;
      // Checked once here, so devices run bound calls without checking them again.
      check_call(c, "layer '" + n.layer + "' on " + dev->info().label());
      const size_t need = dev->workspace_bytes(c);
      if (need > ws.bytes)
        throw Error("layer '" + n.layer + "': op " + std::string(op_name(n.kind)) + " needs a workspace of " +
                    std::to_string(need) + " bytes, the plan reserved " + std::to_string(ws.bytes));
      calls_[slot].push_back(std::move(c));
    }
  patches_.clear();
  for (size_t i = 0; i < node_index_.size(); ++i) {
    const OpDesc& d = op_desc(g_.nodes()[node_index_[i]].kind);
    if (d.patch) patches_.emplace_back(i, &d);
  }
  bound_generation_ = state_.generation();
  patched_step_ = -1;
}

void Executor::patch(const StepScalars& s) {
  if (s.step == patched_step_ && s.lr == patched_lr_ && s.loss_scale == patched_scale_) return;
  for (auto& slot_calls : calls_)
    for (const auto& [i, desc] : patches_) {
      slot_calls[i].attrs = g_.nodes()[node_index_[i]].attrs;  // patches see the graph's attributes
      desc->patch(slot_calls[i].attrs, s);
    }
  patched_step_ = s.step;
  patched_lr_ = s.lr;
  patched_scale_ = s.loss_scale;
}

void Executor::check_batch(const Element& b) const {
  auto check = [&](TensorId t, const HostTensor& h, const char* what) {
    if (t == kNoTensor || plan_.region[static_cast<size_t>(t)] != Region::input) return;
    const auto& ti = g_.tensor(t);
    if (static_cast<int64_t>(h.data.size()) != ti.shape.numel())
      throw DataError(std::string("batch ") + what + " have " + std::to_string(h.data.size()) + " values " +
                      h.shape.str() + ", the model expects " + ti.shape.str());
  };
  check(g_.input, b.x, "features");
  check(g_.label, b.y, "labels");
}

static void check_slot(int slot, int slots) {
  if (slot < 0 || slot >= std::max(1, slots))
    throw Error("input slot " + std::to_string(slot) + " does not exist (this executor has " + std::to_string(slots) +
                ")");
}

void Executor::load_batch(const Element& b, int slot) {
  check_slot(slot, opts_.input_slots);
  if (bound_generation_ != state_.generation()) bind();
  check_batch(b);
  Device* dev = state_.context().device;
  for (auto [t, h] : {std::pair{g_.input, &b.x}, std::pair{g_.label, &b.y}})
    if (t != kNoTensor && plan_.region[static_cast<size_t>(t)] == Region::input)
      dev->copy_from_host(h->data.data(), view(t, slot));
}

std::vector<uint64_t> Executor::upload_batch(const Element& b, int slot) {
  check_slot(slot, opts_.input_slots);
  if (bound_generation_ != state_.generation()) bind();
  check_batch(b);
  Device* dev = state_.context().device;
  std::vector<uint64_t> tickets;
  for (auto [t, h] : {std::pair{g_.input, &b.x}, std::pair{g_.label, &b.y}})
    if (t != kNoTensor && plan_.region[static_cast<size_t>(t)] == Region::input)
      tickets.push_back(dev->upload_async(h->data.data(), view(t, slot)));
  return tickets;
}

void Executor::run(const StepScalars& s, int slot) { run_range(0, size(), s, slot); }

void Executor::run_range(size_t begin, size_t end, const StepScalars& s, int slot) {
  check_slot(slot, opts_.input_slots);
  if (bound_generation_ != state_.generation()) bind();
  patch(s);
  Device* dev = state_.context().device;
  const auto& calls = calls_[static_cast<size_t>(slot)];
  auto* fused = static_cast<FusedRunner*>(dev->extension(kRunFused));
  if (profile_) {  // the same calls, each timed to the device's completion
    dev->synchronize();
    for (size_t i = begin; i < end;) {
      const auto t0 = std::chrono::steady_clock::now();
      size_t k = fused ? fused->run_fused(std::span<const OpCall>(calls).subspan(i, end - i)) : 0;
      if (k == 0) dev->run(calls[i]), k = 1;
      dev->synchronize();
      std::string name(op_name(calls[i].kind));
      for (size_t j = 1; j < k; ++j) name += "+" + std::string(op_name(calls[i + j].kind));
      OpProfile::Entry& e = profile_->ops[name];
      e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++e.calls;
      i += k;
    }
    return;
  }
  for (size_t i = begin; i < end;) {
    const size_t k = fused ? fused->run_fused(std::span<const OpCall>(calls).subspan(i, end - i)) : 0;
    if (k)
      i += k;
    else
      dev->run(calls[i++]);
  }
}

size_t Executor::first_node_of(Phase p) const {
  for (size_t i = 0; i < node_index_.size(); ++i)
    if (g_.nodes()[node_index_[i]].phase == p) return i;
  return node_index_.size();
}

float Executor::read_scalar(TensorId t) {
  BufferView bv = view(t);
  if (bv.dtype != DType::f32) return read(t).data.at(0);
  float v = 0;
  bv.bytes = sizeof(float);
  state_.context().device->copy_to_host(bv, &v);
  return v;
}

// 16-bit tensors travel as their bytes and are converted on the host.
HostTensor Executor::read(TensorId t) {
  HostTensor h(g_.tensor(t).shape);
  const BufferView v = view(t);
  if (v.dtype == DType::f32) {
    state_.context().device->copy_to_host(v, h.data.data());
    return h;
  }
  std::vector<uint16_t> raw(v.bytes / 2);
  state_.context().device->copy_to_host(v, raw.data());
  to_float(raw.data(), v.dtype, h.data.data(), h.data.size());
  return h;
}

void Executor::write(TensorId t, const HostTensor& h) {
  const BufferView v = view(t);
  const auto n = static_cast<size_t>(g_.tensor(t).shape.numel());
  if (h.data.size() != n)
    throw Error("Executor::write: tensor '" + g_.tensor(t).name + "' holds " + std::to_string(n) + " values, got " +
                std::to_string(h.data.size()));
  if (v.dtype == DType::f32) {
    state_.context().device->copy_from_host(h.data.data(), v);
    return;
  }
  std::vector<uint16_t> raw(v.bytes / 2, 0);
  from_float(h.data.data(), raw.data(), v.dtype, n);
  state_.context().device->copy_from_host(raw.data(), v);
}

std::string first_nonfinite_layer(Graph g, DeviceState& state, const Element& batch, int64_t step) {
  PlanOptions po;
  for (const auto& l : g.layer_outputs) po.keep_alive.push_back(l.out);
  auto layers = g.layer_outputs;
  Executor ex(std::move(g), state, po);
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

}  // namespace kiln
