// CpuDevice: aligned host blocks, memcpy copies, and the op dispatch. Every call is checked (buffer count,
// sizes, forbidden overlaps, workspace) without allocating, then runs the kernel on the calling thread's team.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "backend.hpp"
#include "kernels.hpp"
#include "kiln/error.hpp"

namespace kiln::cpu {
namespace {

constexpr size_t kAlignment = 64;

// Checks one call against the op's contract and hands out its host pointers.
class Checked {
 public:
  Checked(const OpCall& c, const DeviceInfo& d) : c_(c), d_(d) {}

  template <class T>
  const T& attrs() const {
    if (const T* p = std::get_if<T>(&c_.attrs)) return *p;
    fail("attributes of the wrong type (variant index " + std::to_string(c_.attrs.index()) + ")");
  }
  void counts(size_t nin, size_t nout) const {
    if (c_.in.size() != nin || c_.out.size() != nout)
      fail("expected " + std::to_string(nin) + " inputs and " + std::to_string(nout) + " outputs, found " +
           std::to_string(c_.in.size()) + " and " + std::to_string(c_.out.size()));
  }
  const float* in(size_t i, int64_t elems) const { return ptr(c_.in[i], "input", i, elems); }
  float* out(size_t i, int64_t elems) const { return ptr(c_.out[i], "output", i, elems); }
  // BLAS takes 32-bit dimensions.
  void blas_dims(std::initializer_list<int64_t> dims) const {
    for (int64_t d : dims)
      if (d > std::numeric_limits<int>::max())
        fail("a dimension of " + std::to_string(d) + " exceeds what BLAS can index (2^31 - 1)");
  }
  void positive(const char* what, int64_t v) const {
    if (v < 1) fail(std::string(what) + " must be >= 1, found " + std::to_string(v));
  }
  // Outputs must not overlap inputs or each other, except output 0 being exactly input `alias_in`
  // (or input `alias_in2`) where ops.hpp says "may alias", and output `unused_out`, which the op ignores.
  void no_overlap(int alias_in = -1, int alias_in2 = -1, int unused_out = -1) const {
    for (size_t o = 0; o < c_.out.size(); ++o) {
      const BufferView& ov = c_.out[o];
      if (!ov.block || ov.bytes == 0 || int(o) == unused_out) continue;
      for (size_t i = 0; i < c_.in.size(); ++i) {
        const BufferView& iv = c_.in[i];
        if (!iv.block || iv.bytes == 0 || !ov.overlaps(iv)) continue;
        const bool allowed =
            o == 0 && (int(i) == alias_in || int(i) == alias_in2) && iv.offset == ov.offset && iv.bytes == ov.bytes;
        if (!allowed) fail("output " + std::to_string(o) + " overlaps input " + std::to_string(i));
      }
      for (size_t p = o + 1; p < c_.out.size(); ++p)
        if (int(p) != unused_out && c_.out[p].block && c_.out[p].bytes && ov.overlaps(c_.out[p]))
          fail("outputs " + std::to_string(o) + " and " + std::to_string(p) + " overlap");
    }
  }
  float* workspace(size_t floats) const {
    if (floats == 0) return nullptr;
    if (!c_.workspace.block || c_.workspace.bytes < floats * sizeof(float))
      fail("needs a workspace of " + std::to_string(floats * sizeof(float)) + " bytes (workspace_bytes()), found " +
           std::to_string(c_.workspace.block ? c_.workspace.bytes : 0));
    return c_.workspace.host();
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw DeviceError(d_.label() + " op " + std::string(op_name(c_.kind)) + ": " + what);
  }

 private:
  float* ptr(const BufferView& v, const char* kind, size_t i, int64_t elems) const {
    if (elems < 0) fail(std::string(kind) + " " + std::to_string(i) + " has a negative size from the attributes");
    const size_t need = static_cast<size_t>(elems) * sizeof(float);
    if (need == 0) return v.block ? v.host() : nullptr;
    if (!v.block || !v.block->ptr) fail(std::string(kind) + " " + std::to_string(i) + " is not bound to memory");
    if (v.bytes < need || v.offset + v.bytes > v.block->bytes)
      fail(std::string(kind) + " " + std::to_string(i) + " holds " + std::to_string(v.bytes) + " bytes at offset " +
           std::to_string(v.offset) + " of a " + std::to_string(v.block->bytes) + "-byte block, expected " +
           std::to_string(need) + " bytes (" + std::to_string(elems) + " floats)");
    return v.host();
  }
  const OpCall& c_;
  const DeviceInfo& d_;
};

}  // namespace

CpuDevice::CpuDevice(DeviceInfo info, int threads)
    : info_(std::move(info)), threads_(threads), pool_(threads), partials_(loss_partials(threads)) {}

CpuDevice::~CpuDevice() {
  {
    std::lock_guard lock(tmu_);
    stop_ = true;  // the thread finishes what is queued first
  }
  tcv_.notify_all();
  if (transfer_.joinable()) transfer_.join();
}

uint64_t CpuDevice::upload_async(const void* src, const BufferView& dst) {
  if (dst.bytes && (!dst.block || dst.offset + dst.bytes > dst.block->bytes))
    throw DeviceError(info_.label() + " upload_async: destination range is outside its block");
  std::lock_guard lock(tmu_);
  if (!transfer_.joinable())
    transfer_ = std::thread([this] {
      std::unique_lock lk(tmu_);
      while (true) {
        tcv_.wait(lk, [&] { return stop_ || !uploads_.empty(); });
        if (uploads_.empty()) return;  // stop_ and nothing left
        const Upload u = uploads_.front();
        lk.unlock();
        if (u.bytes) std::memcpy(u.dst, u.src, u.bytes);
        lk.lock();
        uploads_.pop_front();
        ++completed_;
        tcv_.notify_all();
      }
    });
  uploads_.push_back(Upload{src, dst.bytes ? dst.host() : nullptr, dst.bytes});
  tcv_.notify_all();
  return ++issued_;
}

void CpuDevice::wait_upload(uint64_t ticket) {
  std::unique_lock lk(tmu_);
  if (ticket > issued_) throw DeviceError(info_.label() + " wait_upload: ticket " + std::to_string(ticket) + " was never issued");
  tcv_.wait(lk, [&] { return completed_ >= ticket; });
}

void CpuDevice::synchronize() {
  std::unique_lock lk(tmu_);
  tcv_.wait(lk, [&] { return completed_ >= issued_; });
}

size_t CpuDevice::query_free_memory() {
  info_.free_memory = read_available_memory();
  return info_.free_memory;
}

Block* CpuDevice::allocate_block(size_t bytes) {
  void* p = nullptr;
  const size_t padded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (padded < bytes || ::posix_memalign(&p, kAlignment, padded == 0 ? kAlignment : padded) != 0) return nullptr;
  Block* b = new (std::nothrow) Block{p, nullptr, bytes, next_block_id_.fetch_add(1)};
  if (!b) {
    std::free(p);
    return nullptr;
  }
  live_blocks_.fetch_add(1);
  return b;
}

void CpuDevice::free_block(Block* b) noexcept {
  if (!b) return;
  std::free(b->ptr);
  delete b;
  live_blocks_.fetch_sub(1);
}

void CpuDevice::copy_from_host(const void* src, const BufferView& dst) {
  if (dst.bytes && (!dst.block || dst.offset + dst.bytes > dst.block->bytes))
    throw DeviceError(info_.label() + " copy_from_host: destination range is outside its block");
  if (dst.bytes) std::memcpy(dst.host(), src, dst.bytes);
}

void CpuDevice::copy_to_host(const BufferView& src, void* dst) {
  if (src.bytes && (!src.block || src.offset + src.bytes > src.block->bytes))
    throw DeviceError(info_.label() + " copy_to_host: source range is outside its block");
  if (src.bytes) std::memcpy(dst, src.host(), src.bytes);
}

void CpuDevice::copy_on_device(const BufferView& src, const BufferView& dst) {
  if (src.bytes != dst.bytes)
    throw DeviceError(info_.label() + " copy_on_device: source has " + std::to_string(src.bytes) +
                      " bytes, destination " + std::to_string(dst.bytes));
  if (!src.bytes) return;
  if (!src.block || !dst.block || src.offset + src.bytes > src.block->bytes ||
      dst.offset + dst.bytes > dst.block->bytes)
    throw DeviceError(info_.label() + " copy_on_device: a range is outside its block");
  std::memmove(dst.host(), src.host(), src.bytes);
}

Support CpuDevice::supports(OpKind kind, const OpAttrs&) const {
  if (kind >= OpKind::Count_) return {false, "unknown op kind " + std::to_string(static_cast<int>(kind))};
  return {};
}

size_t CpuDevice::workspace_bytes(const OpCall& call) const {
  switch (call.kind) {
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter:
      if (const auto* a = std::get_if<ConvAttrs>(&call.attrs))
        return conv_workspace_floats(call.kind, *a, threads_) * sizeof(float);
      return 0;
    default:
      return 0;
  }
}

void CpuDevice::run(const OpCall& call) {
  const Checked c(call, info_);
  switch (call.kind) {
    case OpKind::Gemm: {
      const auto& a = c.attrs<GemmAttrs>();
      c.counts(2, 1);
      c.no_overlap();
      c.blas_dims({a.m, a.n, a.k});
      return gemm(a, c.in(0, a.m * a.k), c.in(1, a.k * a.n), c.out(0, a.m * a.n), pool_);
    }
    case OpKind::BiasAdd: {
      const auto& a = c.attrs<BiasAttrs>();
      const int64_t n = a.outer * a.channels * a.inner;
      c.counts(2, 1);
      c.no_overlap(0);
      return bias_add(a, c.in(0, n), c.in(1, a.channels), c.out(0, n), pool_);
    }
    case OpKind::BiasGrad: {
      const auto& a = c.attrs<BiasAttrs>();
      c.counts(1, 1);
      c.no_overlap();
      return bias_grad(a, c.in(0, a.outer * a.channels * a.inner), c.out(0, a.channels), pool_);
    }
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter: {
      const auto& a = c.attrs<ConvAttrs>();
      c.counts(2, 1);
      c.no_overlap();
      c.positive("stride_h", a.stride_h);
      c.positive("stride_w", a.stride_w);
      if (a.pad_h < 0 || a.pad_w < 0) c.fail("padding must be >= 0");
      c.blas_dims({a.k, a.c * a.r * a.s, a.oh * a.ow});
      const int64_t x = a.n * a.c * a.h * a.w, w = a.k * a.c * a.r * a.s, y = a.n * a.k * a.oh * a.ow;
      float* ws = c.workspace(conv_workspace_floats(call.kind, a, threads_));
      if (call.kind == OpKind::Conv2dForward) return conv2d_forward(a, c.in(0, x), c.in(1, w), c.out(0, y), ws, pool_);
      if (call.kind == OpKind::Conv2dBackwardData)
        return conv2d_backward_data(a, c.in(0, y), c.in(1, w), c.out(0, x), ws, pool_);
      return conv2d_backward_filter(a, c.in(0, x), c.in(1, y), c.out(0, w), ws, pool_);
    }
    case OpKind::MaxPoolForward:
    case OpKind::MaxPoolBackward:
    case OpKind::AvgPoolForward:
    case OpKind::AvgPoolBackward: {
      const auto& a = c.attrs<PoolAttrs>();
      c.positive("stride_h", a.stride_h);
      c.positive("stride_w", a.stride_w);
      const int64_t x = a.n * a.c * a.h * a.w, y = a.n * a.c * a.oh * a.ow;
      if (call.kind == OpKind::MaxPoolBackward) {
        c.counts(3, 1);
        c.no_overlap();
        return max_pool_backward(a, c.in(0, x), c.in(1, y), c.in(2, y), c.out(0, x), pool_);
      }
      c.counts(1, 1);
      c.no_overlap();
      if (call.kind == OpKind::MaxPoolForward) return max_pool_forward(a, c.in(0, x), c.out(0, y), pool_);
      if (call.kind == OpKind::AvgPoolForward) return avg_pool_forward(a, c.in(0, x), c.out(0, y), pool_);
      return avg_pool_backward(a, c.in(0, y), c.out(0, x), pool_);
    }
    case OpKind::ActivationForward: {
      const auto& a = c.attrs<ActivationAttrs>();
      c.counts(1, 1);
      c.no_overlap(0);
      return activation_forward(a, c.in(0, a.count), c.out(0, a.count), pool_);
    }
    case OpKind::ActivationBackward: {
      const auto& a = c.attrs<ActivationAttrs>();
      c.counts(2, 1);
      c.no_overlap(1);
      return activation_backward(a, c.in(0, a.count), c.in(1, a.count), c.out(0, a.count), pool_);
    }
    case OpKind::SoftmaxForward:
    case OpKind::SoftmaxBackward: {
      const auto& a = c.attrs<SoftmaxAttrs>();
      const int64_t n = a.rows * a.cols;
      c.no_overlap();
      if (call.kind == OpKind::SoftmaxForward) {
        c.counts(1, 1);
        return softmax_forward(a, c.in(0, n), c.out(0, n), pool_);
      }
      c.counts(2, 1);
      return softmax_backward(a, c.in(0, n), c.in(1, n), c.out(0, n), pool_);
    }
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::MeanSquaredError:
    case OpKind::BinaryCrossEntropy: {
      const auto& a = c.attrs<LossAttrs>();
      const int64_t n = a.rows * a.cols;
      c.counts(2, 2);
      c.no_overlap();
      if (call.kind == OpKind::SoftmaxCrossEntropy)
        return softmax_cross_entropy(a, c.in(0, n), c.in(1, a.rows), c.out(0, 1), c.out(1, n), partials_.data(), pool_);
      if (call.kind == OpKind::MeanSquaredError)
        return mean_squared_error(a, c.in(0, n), c.in(1, n), c.out(0, 1), c.out(1, n), partials_.data(), pool_);
      return binary_cross_entropy(a, c.in(0, n), c.in(1, n), c.out(0, 1), c.out(1, n), partials_.data(), pool_);
    }
    case OpKind::Add:
    case OpKind::Mul: {
      const auto& a = c.attrs<ElementwiseAttrs>();
      c.counts(2, 1);
      c.no_overlap(0, 1);
      const float *x = c.in(0, a.count), *z = c.in(1, a.count);
      float* y = c.out(0, a.count);
      return call.kind == OpKind::Add ? add(a, x, z, y, pool_) : mul(a, x, z, y, pool_);
    }
    case OpKind::Axpby:
    case OpKind::Scale:
    case OpKind::Copy: {
      const auto& a = c.attrs<ElementwiseAttrs>();
      c.counts(1, 1);
      c.no_overlap(call.kind == OpKind::Scale ? 0 : -1);
      const float* x = c.in(0, a.count);
      float* y = c.out(0, a.count);
      if (call.kind == OpKind::Axpby) return axpby(a, x, y, pool_);
      if (call.kind == OpKind::Scale) return scale(a, x, y, pool_);
      return copy(a, x, y, pool_);
    }
    case OpKind::Fill: {
      const auto& a = c.attrs<ElementwiseAttrs>();
      c.counts(0, 1);
      return fill(a, c.out(0, a.count), pool_);
    }
    case OpKind::ReduceSum: {
      const auto& a = c.attrs<ReduceAttrs>();
      c.counts(1, 1);
      c.no_overlap();
      return reduce_sum(a, c.in(0, a.outer * a.reduce * a.inner), c.out(0, a.outer * a.inner), pool_);
    }
    case OpKind::Concat:
    case OpKind::Split: {
      const auto& a = c.attrs<ConcatAttrs>();
      const size_t parts = a.sizes.size();
      int64_t total = 0;
      for (int64_t s : a.sizes) total += s;
      const bool cat = call.kind == OpKind::Concat;
      if (cat)
        c.counts(parts, 1);
      else
        c.counts(1, parts);
      c.no_overlap();
      if (part_ptrs_.size() < parts) part_ptrs_.resize(parts);  // grows once per shape, not per call
      for (size_t j = 0; j < parts; ++j) {
        const int64_t n = a.outer * a.sizes[j] * a.inner;
        part_ptrs_[j] = cat ? const_cast<float*>(c.in(j, n)) : c.out(j, n);
      }
      if (cat) return concat(a, part_ptrs_.data(), c.out(0, a.outer * total * a.inner), pool_);
      return split(a, c.in(0, a.outer * total * a.inner), part_ptrs_.data(), pool_);
    }
    case OpKind::DropoutForward:
    case OpKind::DropoutBackward: {
      const auto& a = c.attrs<DropoutAttrs>();
      c.counts(1, 1);
      c.no_overlap(0);
      if (!(a.rate >= 0.f && a.rate <= 1.f)) c.fail("rate must be in [0, 1], found " + std::to_string(a.rate));
      return dropout(a, c.in(0, a.count), c.out(0, a.count), pool_);
    }
    case OpKind::SgdUpdate: {
      const auto& a = c.attrs<SgdAttrs>();
      c.counts(1, 2);
      c.no_overlap(-1, -1, a.momentum == 0.f ? 1 : -1);  // v is unused (may be w) without momentum
      return sgd_update(a, c.in(0, a.count), c.out(0, a.count), c.out(1, a.momentum == 0.f ? 0 : a.count), pool_);
    }
    case OpKind::AdamUpdate: {
      const auto& a = c.attrs<AdamAttrs>();
      c.counts(1, 3);
      c.no_overlap();
      if (a.step < 1) c.fail("step must be >= 1, found " + std::to_string(a.step));
      return adam_update(a, c.in(0, a.count), c.out(0, a.count), c.out(1, a.count), c.out(2, a.count), pool_);
    }
    case OpKind::RmspropUpdate: {
      const auto& a = c.attrs<RmspropAttrs>();
      c.counts(1, 3);
      c.no_overlap(-1, -1, a.momentum > 0.f ? -1 : 2);  // buf is unused (may be any buffer) without momentum
      return rmsprop_update(a, c.in(0, a.count), c.out(0, a.count), c.out(1, a.count),
                            c.out(2, a.momentum > 0.f ? a.count : 0), pool_);
    }
    case OpKind::EmaUpdate: {
      const auto& a = c.attrs<EmaAttrs>();
      c.counts(1, 1);
      c.no_overlap();
      return ema_update(a, c.in(0, a.count), c.out(0, a.count), pool_);
    }
    case OpKind::Count_:
      break;
  }
  c.fail("unknown op kind " + std::to_string(static_cast<int>(call.kind)));
}

}  // namespace kiln::cpu
