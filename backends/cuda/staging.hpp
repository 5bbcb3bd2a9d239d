// Host<->device transfers through two pinned host buffers used alternately, so copying into one overlaps the
// DMA out of the other, and a large transfer needs no pinned buffer of its own size.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "handles.hpp"

namespace kiln::cuda {

class PinnedStaging {
 public:
  explicit PinnedStaging(cudaStream_t stream, size_t chunk_bytes = size_t{8} << 20);

  // Enqueues src -> dst_device on the stream; returns once `src` may be reused (the copy itself is in order on
  // the stream, not necessarily done).
  void to_device(const void* src, void* dst_device, size_t bytes);
  // Copies src_device -> dst after all earlier work on the stream; returns when `dst` holds the bytes.
  void to_host(const void* src_device, void* dst, size_t bytes);

 private:
  struct Chunk {
    PinnedMemory host;
    EventHandle done;      // recorded after the last copy that used `host`
    bool pending = false;  // `done` was recorded and not yet waited on
  };
  Chunk& chunk(size_t i);  // allocates lazily
  void wait(Chunk& c);

  cudaStream_t stream_;
  size_t chunk_bytes_;
  std::array<Chunk, 2> chunks_;
  size_t next_ = 0;  // to_device rotates through the chunks across calls, so back-to-back copies do not wait
};

}  // namespace kiln::cuda
