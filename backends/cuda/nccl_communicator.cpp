#include "nccl_communicator.hpp"

#include <nccl.h>

#include <mutex>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda_device.hpp"
#include "kiln/error.hpp"

namespace kiln::cuda {
namespace {

CudaDevice* as_cuda(Device* d, size_t rank) {
  auto* cd = d ? static_cast<CudaDevice*>(d->extension("cuda.device")) : nullptr;
  if (!cd)
    throw DeviceError("nccl communicator: rank " + std::to_string(rank) + " is " +
                      (d ? d->info().label() : std::string("a null device")) +
                      ", not a CUDA device; NCCL joins cuda devices only (use the host ring for mixed devices)");
  return cd;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::span<Device* const> devices) {
    std::vector<int> ordinals;
    for (size_t r = 0; r < devices.size(); ++r) {
      CudaDevice* d = as_cuda(devices[r], r);
      for (size_t q = 0; q < r; ++q)
        if (devices_[q]->ordinal() == d->ordinal())
          throw DeviceError("nccl communicator: " + d->info().label() + " appears twice (ranks " + std::to_string(q) +
                            " and " + std::to_string(r) + "); NCCL needs one rank per GPU");
      devices_.push_back(d);
      ordinals.push_back(d->ordinal());
    }
    if (devices_.empty()) throw DeviceError("nccl communicator: no devices given");
    comms_.resize(devices_.size());
    KILN_NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(comms_.size()), ordinals.data()));
  }

  ~NcclCommunicator() override {
    for (ncclComm_t c : comms_)
      if (c) ncclCommDestroy(c);
  }

  int size() const override { return static_cast<int>(devices_.size()); }

  void all_reduce_sum(std::span<const BufferView> bufs, std::span<Device* const> devices) override {
    auto locks = prepare(bufs, devices, "all_reduce_sum");
    if (bufs[0].bytes % sizeof(float) != 0)
      throw DeviceError("nccl all_reduce_sum: " + std::to_string(bufs[0].bytes) +
                        " bytes is not a whole number of f32 values");
    const size_t count = bufs[0].bytes / sizeof(float);
    if (count == 0) return;
    KILN_NCCL_CHECK(ncclGroupStart());
    for (size_t r = 0; r < devices_.size(); ++r) {
      void* p = static_cast<char*>(bufs[r].block->ptr) + bufs[r].offset;
      const ncclResult_t e = ncclAllReduce(p, p, count, ncclFloat, ncclSum, comms_[r], devices_[r]->stream());
      if (e != ncclSuccess) {
        ncclGroupEnd();
        throw_error(Library::nccl, e, "ncclAllReduce(p, p, count, ncclFloat, ncclSum, comm, stream)", __FILE__, __LINE__);
      }
    }
    KILN_NCCL_CHECK(ncclGroupEnd());
  }

  void broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) override {
    if (root < 0 || root >= size())
      throw DeviceError("nccl broadcast: root " + std::to_string(root) + " is not a rank of this " +
                        std::to_string(size()) + "-device communicator");
    auto locks = prepare(bufs, devices, "broadcast");
    const size_t bytes = bufs[0].bytes;
    if (bytes == 0) return;
    KILN_NCCL_CHECK(ncclGroupStart());
    for (size_t r = 0; r < devices_.size(); ++r) {
      void* p = static_cast<char*>(bufs[r].block->ptr) + bufs[r].offset;
      const ncclResult_t e = ncclBroadcast(p, p, bytes, ncclUint8, root, comms_[r], devices_[r]->stream());
      if (e != ncclSuccess) {
        ncclGroupEnd();
        throw_error(Library::nccl, e, "ncclBroadcast(p, p, bytes, ncclUint8, root, comm, stream)", __FILE__, __LINE__);
      }
    }
    KILN_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  // Checks the arguments, then locks every device in rank order and finishes its pending graph work, so the
  // collective is ordered after everything already enqueued for it.
  std::vector<std::unique_lock<std::mutex>> prepare(std::span<const BufferView> bufs, std::span<Device* const> devices,
                                                    const char* what) {
    if (devices.size() != devices_.size() || bufs.size() != devices_.size())
      throw DeviceError(std::string("nccl ") + what + ": the communicator has " + std::to_string(devices_.size()) +
                        " ranks, the call gave " + std::to_string(devices.size()) + " devices and " +
                        std::to_string(bufs.size()) + " buffers");
    for (size_t r = 0; r < devices_.size(); ++r) {
      if (as_cuda(devices[r], r) != devices_[r])
        throw DeviceError(std::string("nccl ") + what + ": rank " + std::to_string(r) + " was " +
                          devices_[r]->info().label() + " when the communicator was made, the call gives " +
                          devices[r]->info().label());
      if (bufs[r].bytes != bufs[0].bytes || (bufs[r].bytes > 0 && !bufs[r].block))
        throw DeviceError(std::string("nccl ") + what + ": every rank needs a buffer of the same size; rank 0 has " +
                          std::to_string(bufs[0].bytes) + " bytes, rank " + std::to_string(r) + " has " +
                          std::to_string(bufs[r].bytes));
    }
    std::vector<std::unique_lock<std::mutex>> locks;
    for (CudaDevice* d : devices_) locks.push_back(d->lock_for_external_work());
    return locks;
  }

  std::vector<CudaDevice*> devices_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::span<Device* const> devices) {
  return std::make_unique<NcclCommunicator>(devices);
}

}  // namespace kiln::cuda
