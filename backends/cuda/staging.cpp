#include "staging.hpp"

#include <algorithm>
#include <cstring>

#include "check.hpp"

namespace kiln::cuda {

PinnedStaging::PinnedStaging(cudaStream_t stream, size_t chunk_bytes) : stream_(stream), chunk_bytes_(chunk_bytes) {}

PinnedStaging::Chunk& PinnedStaging::chunk(size_t i) {
  Chunk& c = chunks_[i % chunks_.size()];
  if (!c.host) {
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaHostAlloc(&p, chunk_bytes_, cudaHostAllocDefault));
    c.host.reset(p);
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    c.done.reset(e);
  }
  return c;
}

void PinnedStaging::wait(Chunk& c) {
  if (!c.pending) return;
  KILN_CUDA_CHECK(cudaEventSynchronize(c.done.get()));
  c.pending = false;
}

void PinnedStaging::to_device(const void* src, void* dst_device, size_t bytes) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst_device);
  for (size_t off = 0; off < bytes; off += chunk_bytes_) {
    const size_t n = std::min(chunk_bytes_, bytes - off);
    Chunk& c = chunk(next_++);
    wait(c);  // the DMA that last read this buffer must be done before it is overwritten
    std::memcpy(c.host.get(), s + off, n);
    KILN_CUDA_CHECK(cudaMemcpyAsync(d + off, c.host.get(), n, cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaEventRecord(c.done.get(), stream_));
    c.pending = true;
  }
}

void PinnedStaging::to_host(const void* src_device, void* dst, size_t bytes) {
  const auto* s = static_cast<const char*>(src_device);
  auto* d = static_cast<char*>(dst);
  // Chunk i is copied out on the host while chunk i+1 is in flight.
  size_t prev_off = 0, prev_n = 0;
  for (size_t off = 0, i = 0; off < bytes; off += chunk_bytes_, ++i) {
    const size_t n = std::min(chunk_bytes_, bytes - off);
    Chunk& c = chunk(i);
    wait(c);
    KILN_CUDA_CHECK(cudaMemcpyAsync(c.host.get(), s + off, n, cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaEventRecord(c.done.get(), stream_));
    c.pending = true;
    if (i > 0) {
      Chunk& p = chunk(i - 1);
      wait(p);
      std::memcpy(d + prev_off, p.host.get(), prev_n);
    }
    prev_off = off;
    prev_n = n;
  }
  if (bytes > 0) {
    Chunk& last = chunk((bytes - 1) / chunk_bytes_);
    wait(last);
    std::memcpy(d + prev_off, last.host.get(), prev_n);
  }
}

}  // namespace kiln::cuda
