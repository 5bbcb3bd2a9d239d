// The "nccl" communicator: in-place all-reduce (sum) and broadcast across the CUDA devices of this process, one
// NCCL rank per device, enqueued on each device's stream after the work already ordered there.
#pragma once
#include <memory>
#include <span>

#include "kiln/strategy.hpp"

namespace kiln::cuda {

// Throws DeviceError when a device is not a CUDA device, a device appears twice, or NCCL cannot initialize.
std::unique_ptr<Communicator> make_nccl_communicator(std::span<Device* const> devices);

}  // namespace kiln::cuda
