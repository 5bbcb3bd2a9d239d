// MpiCommunicator: hierarchical collectives. The buffers of this process's devices are summed in device order into
// one host buffer, summed across processes by MpiGroup, and copied back to every local device.
#include <cstring>

#include "kiln/error.hpp"
#include "mpi_group.hpp"

namespace kiln::mpi {

namespace {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MpiGroup& group, std::span<Device* const> devices)
      : group_(group), devices_(devices.begin(), devices.end()) {
    if (devices_.empty()) throw Error("mpi communicator: no devices");
    // Roots and shards count every process's devices as rank * size() + local: every process needs as many.
    const int mine = size();
    auto all = group_.all_gather({reinterpret_cast<const uint8_t*>(&mine), sizeof mine});
    for (size_t r = 0; r < all.size(); ++r) {
      int theirs = 0;
      std::memcpy(&theirs, all[r].data(), sizeof theirs);
      if (theirs != mine)
        throw ConfigError("[strategy] devices: rank " + std::to_string(r) + " (" + group_.host_of(static_cast<int>(r)) +
                          ") runs " + std::to_string(theirs) + " replica(s), rank " + std::to_string(group_.rank()) +
                          " (" + group_.host() + ") runs " + std::to_string(mine) +
                          "; every rank must drive the same number of devices");
    }
  }
  int size() const override { return static_cast<int>(devices_.size()); }

  void all_reduce_sum(std::span<const BufferView> bufs, std::span<Device* const> devices) override {
    check(bufs, devices, "all_reduce_sum");
    const size_t n = bufs[0].bytes / sizeof(float);
    if (n == 0) return;
    acc_.resize(n);
    read(0, bufs[0], acc_.data());
    for (size_t r = 1; r < bufs.size(); ++r) {
      stage_.resize(n);
      read(r, bufs[r], stage_.data());
      for (size_t i = 0; i < n; ++i) acc_[i] += stage_[i];
    }
    group_.sum_floats(acc_.data(), n, "a gradient all-reduce");
    for (size_t r = 0; r < bufs.size(); ++r) write(r, acc_.data(), bufs[r]);
  }

  void broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) override {
    check(bufs, devices, "broadcast");
    const int local = size();
    if (root < 0 || root >= local * group_.size())
      throw Error("mpi communicator broadcast: root " + std::to_string(root) + " is not one of the " +
                  std::to_string(local * group_.size()) + " devices of the group");
    const int root_rank = root / local;
    const size_t root_dev = static_cast<size_t>(root % local);
    const size_t bytes = bufs[0].bytes;
    if (bytes == 0) return;
    acc_.resize((bytes + sizeof(float) - 1) / sizeof(float));
    if (group_.rank() == root_rank) read(root_dev, bufs[root_dev], acc_.data());
    group_.broadcast_bytes(acc_.data(), bytes, root_rank, "a weights broadcast");
    for (size_t r = 0; r < bufs.size(); ++r)
      if (group_.rank() != root_rank || r != root_dev) write(r, acc_.data(), bufs[r]);
  }

 private:
  void check(std::span<const BufferView> bufs, std::span<Device* const> devices, const char* op) const {
    if (bufs.size() != devices_.size() || devices.size() != devices_.size())
      throw Error(std::string("mpi communicator ") + op + ": expected one buffer per local device (" +
                  std::to_string(devices_.size()) + "), found " + std::to_string(bufs.size()) + " buffers for " +
                  std::to_string(devices.size()) + " devices");
    for (size_t r = 0; r < bufs.size(); ++r) {
      if (devices[r] != devices_[r])
        throw Error(std::string("mpi communicator ") + op + ": device " + std::to_string(r) +
                    " differs from the one it was created with");
      if (bufs[r].bytes != bufs[0].bytes)
        throw Error(std::string("mpi communicator ") + op + ": device " + std::to_string(r) + " passes " +
                    std::to_string(bufs[r].bytes) + " bytes, device 0 " + std::to_string(bufs[0].bytes));
      if (bufs[r].bytes && (!bufs[r].block || bufs[r].offset + bufs[r].bytes > bufs[r].block->bytes))
        throw Error(std::string("mpi communicator ") + op + ": the buffer of device " + std::to_string(r) +
                    " lies outside its block");
    }
  }
  void read(size_t r, const BufferView& v, void* host) {
    if (devices_[r]->info().host_addressable)
      std::memcpy(host, static_cast<const char*>(v.block->ptr) + v.offset, v.bytes);
    else
      devices_[r]->copy_to_host(v, host);
  }
  void write(size_t r, const void* host, const BufferView& v) {
    if (devices_[r]->info().host_addressable)
      std::memcpy(static_cast<char*>(v.block->ptr) + v.offset, host, v.bytes);
    else
      devices_[r]->copy_from_host(host, v);
  }

  MpiGroup& group_;
  std::vector<Device*> devices_;
  std::vector<float> acc_, stage_;
};

}  // namespace

std::unique_ptr<Communicator> MpiGroup::communicator(std::span<Device* const> devices) {
  return std::make_unique<MpiCommunicator>(*this, devices);
}

}  // namespace kiln::mpi
