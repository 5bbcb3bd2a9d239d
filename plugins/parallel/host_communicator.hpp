// The in-process communicator ("host"): collectives over the devices of this process through host memory.
#pragma once
#include <span>
#include <vector>

#include "kiln/strategy.hpp"

namespace kiln::parallel {

// All-reduce and broadcast for any mix of backends. CPU buffers are reduced in place; other devices are staged
// through host buffers with copy_to_host / copy_from_host. Sums run in rank order, so every rank receives the
// same bits and integer-valued data (below 2^24) is summed exactly.
class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(std::span<Device* const> devices);
  int size() const override { return static_cast<int>(devices_.size()); }
  void all_reduce_sum(std::span<const BufferView> bufs, std::span<Device* const> devices) override;
  void broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) override;

 private:
  void check(std::span<const BufferView> bufs, std::span<Device* const> devices, const char* op) const;
  std::vector<Device*> devices_;
  std::vector<bool> host_addressable_;     // per rank: blocks are host memory (the cpu backend)
  std::vector<std::vector<float>> stage_;  // per rank staging for the others
};

// Copies `src` on `from` into `dst` on `to` (any two devices; host memory directly for CPU devices).
void copy_between(Device& from, const BufferView& src, Device& to, const BufferView& dst, std::vector<float>& stage);

}  // namespace kiln::parallel
