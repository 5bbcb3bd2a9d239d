// HostCommunicator: rank-ordered sums through host memory, chunked so each chunk stays in cache.
#include "host_communicator.hpp"

#include <algorithm>
#include <cstring>

#include "kiln/error.hpp"

namespace kiln::parallel {

namespace {

constexpr size_t kChunkFloats = size_t{1} << 16;  // 256 KiB per rank and chunk

bool is_host(const Device& d) { return d.info().host_addressable; }

BufferView sub(const BufferView& v, size_t first_float, size_t floats) {
  BufferView s = v;
  s.offset += first_float * sizeof(float);
  s.bytes = floats * sizeof(float);
  return s;
}

}  // namespace

void copy_between(Device& from, const BufferView& src, Device& to, const BufferView& dst, std::vector<float>& stage) {
  if (src.bytes != dst.bytes)
    throw DeviceError("copy " + from.info().label() + " -> " + to.info().label() + ": source has " +
                      std::to_string(src.bytes) + " bytes, destination " + std::to_string(dst.bytes));
  if (src.bytes == 0) return;
  if (&from == &to) return from.copy_on_device(src, dst);
  if (is_host(from) && is_host(to)) {
    std::memcpy(static_cast<char*>(dst.block->ptr) + dst.offset, static_cast<const char*>(src.block->ptr) + src.offset,
                src.bytes);
    return;
  }
  if (is_host(to)) return from.copy_to_host(src, static_cast<char*>(dst.block->ptr) + dst.offset);
  if (is_host(from)) return to.copy_from_host(static_cast<const char*>(src.block->ptr) + src.offset, dst);
  stage.resize((src.bytes + sizeof(float) - 1) / sizeof(float));
  from.copy_to_host(src, stage.data());
  to.copy_from_host(stage.data(), dst);
}

HostCommunicator::HostCommunicator(std::span<Device* const> devices) : devices_(devices.begin(), devices.end()) {
  if (devices_.empty()) throw Error("host communicator: no devices");
  for (auto* d : devices_) {
    if (!d) throw Error("host communicator: a device is null");
    host_addressable_.push_back(is_host(*d));
  }
  stage_.resize(devices_.size());
}

void HostCommunicator::check(std::span<const BufferView> bufs, std::span<Device* const> devices, const char* op) const {
  if (bufs.size() != devices_.size() || devices.size() != devices_.size())
    throw Error(std::string("host communicator ") + op + ": expected one buffer per rank (" +
                std::to_string(devices_.size()) + "), found " + std::to_string(bufs.size()) + " buffers for " +
                std::to_string(devices.size()) + " devices");
  for (size_t r = 0; r < bufs.size(); ++r) {
    if (devices[r] != devices_[r])
      throw Error(std::string("host communicator ") + op + ": rank " + std::to_string(r) + " is " +
                  devices_[r]->info().label() + ", the call passed " +
                  (devices[r] ? devices[r]->info().label() : std::string("null")));
    if (bufs[r].bytes != bufs[0].bytes || bufs[r].bytes % sizeof(float) != 0)
      throw Error(std::string("host communicator ") + op + ": rank " + std::to_string(r) + " passes " +
                  std::to_string(bufs[r].bytes) + " bytes, rank 0 " + std::to_string(bufs[0].bytes) +
                  " (sizes must match and be whole floats)");
    if (bufs[r].bytes && (!bufs[r].block || bufs[r].offset + bufs[r].bytes > bufs[r].block->bytes))
      throw Error(std::string("host communicator ") + op + ": the buffer of rank " + std::to_string(r) +
                  " lies outside its block");
  }
}

void HostCommunicator::all_reduce_sum(std::span<const BufferView> bufs, std::span<Device* const> devices) {
  check(bufs, devices, "all_reduce_sum");
  const size_t ranks = bufs.size(), total = bufs[0].bytes / sizeof(float);
  if (ranks == 1 || total == 0) return;
  for (size_t c0 = 0; c0 < total; c0 += kChunkFloats) {
    const size_t n = std::min(kChunkFloats, total - c0);
    // The chunk of every rank, as host memory (staged where the device is not host memory).
    std::vector<float*> p(ranks);
    for (size_t r = 0; r < ranks; ++r) {
      BufferView s = sub(bufs[r], c0, n);
      if (host_addressable_[r]) {
        p[r] = s.host();
      } else {
        stage_[r].resize(n);
        devices_[r]->copy_to_host(s, stage_[r].data());
        p[r] = stage_[r].data();
      }
    }
    float* acc = p[0];
    for (size_t r = 1; r < ranks; ++r) {
      const float* src = p[r];
      for (size_t i = 0; i < n; ++i) acc[i] += src[i];
    }
    for (size_t r = 0; r < ranks; ++r) {
      BufferView s = sub(bufs[r], c0, n);
      if (r > 0 && host_addressable_[r]) std::memcpy(p[r], acc, n * sizeof(float));
      if (!host_addressable_[r]) devices_[r]->copy_from_host(acc, s);
    }
  }
}

void HostCommunicator::broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) {
  check(bufs, devices, "broadcast");
  if (root < 0 || root >= size())
    throw Error("host communicator broadcast: root " + std::to_string(root) + " is not a rank");
  for (size_t r = 0; r < bufs.size(); ++r)
    if (static_cast<int>(r) != root)
      copy_between(*devices_[static_cast<size_t>(root)], bufs[static_cast<size_t>(root)], *devices_[r], bufs[r],
                   stage_[r]);
}

}  // namespace kiln::parallel
