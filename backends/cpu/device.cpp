// CpuDevice: aligned host blocks, memcpy copies and the transfer thread. The op dispatch is dispatch.cpp.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "backend.hpp"
#include "cpu_kernel.hpp"
#include "gemm.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "loss.hpp"

namespace kiln::cpu {
namespace {

constexpr size_t kAlignment = 64;

}  // namespace

CpuDevice::CpuDevice(DeviceInfo info, int threads, bool winograd)
    : info_(std::move(info)),
      threads_(threads),
      winograd_(winograd),
      pool_(threads),
      partials_(loss_partials(threads)) {
  blas_warm_up(pool_);
  // Every kernel registered so far (the plugin registered its own before any device opens), indexed by kind: the
  // dispatch of a call is then one load.
  kernels_.resize(op_count());
  for (size_t k = 0; k < kernels_.size(); ++k) kernels_[k] = find_kernel<CpuKernel>("cpu", static_cast<OpKind>(k));
}

CpuDevice::~CpuDevice() {
  {
    std::lock_guard lock(tmu_);
    stop_ = true;  // the thread finishes what is queued first
  }
  tcv_.notify_all();
  if (transfer_.joinable()) transfer_.join();
}

uint64_t CpuDevice::do_upload_async(const void* src, const BufferView& dst) {
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
  if (ticket > issued_)
    throw DeviceError(info_.label() + " wait_upload: ticket " + std::to_string(ticket) + " was never issued");
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

void CpuDevice::do_copy_from_host(const void* src, const BufferView& dst) { std::memcpy(dst.host(), src, dst.bytes); }

void CpuDevice::do_copy_to_host(const BufferView& src, void* dst) { std::memcpy(dst, src.host(), src.bytes); }

// Device::copy_on_device refused overlapping views and equal ones never get here: memcpy, not memmove.
void CpuDevice::do_copy_on_device(const BufferView& src, const BufferView& dst) {
  std::memcpy(dst.host(), src.host(), src.bytes);
}

}  // namespace kiln::cpu
