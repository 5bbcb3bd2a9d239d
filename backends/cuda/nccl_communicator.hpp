// The "nccl" communicator: in-place all-reduce (sum) and broadcast across the CUDA devices of this process, one
// NCCL rank per device, enqueued on each device's stream after the work already ordered there.
#pragma once
#include <memory>
#include <span>

#include "kiln/strategy.hpp"

namespace kiln::cuda {

// Throws DeviceError when a device is not a CUDA device, a device appears twice, or NCCL cannot initialize.
std::unique_ptr<Communicator> make_nccl_communicator(std::span<Device* const> devices);

// One NCCL communicator over every CUDA device of every process of `group` (process p's local device r is NCCL rank
// p * devices.size() + r): rank 0's ncclGetUniqueId reaches the others through group.all_gather, then each process
// joins with ncclCommInitRank per device. Every process calls it at the same point. Besides the errors above it
// throws DeviceError, on every process, when a process gives another device count, when two processes on one host
// drive the same GPU, or when one of them cannot take part (its reason is named).
std::unique_ptr<Communicator> make_nccl_group_communicator(std::span<Device* const> devices, ProcessGroup& group);

}  // namespace kiln::cuda
