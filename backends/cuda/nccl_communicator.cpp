#include "nccl_communicator.hpp"

#include <nccl.h>

#include <cstring>
#include <map>
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

// The devices of this process as CUDA devices, each once; throws DeviceError otherwise.
std::vector<CudaDevice*> take_devices(std::span<Device* const> devices) {
  std::vector<CudaDevice*> out;
  for (size_t r = 0; r < devices.size(); ++r) {
    CudaDevice* d = as_cuda(devices[r], r);
    for (size_t q = 0; q < r; ++q)
      if (out[q]->ordinal() == d->ordinal())
        throw DeviceError("nccl communicator: " + d->info().label() + " appears twice (ranks " + std::to_string(q) +
                          " and " + std::to_string(r) + "); NCCL needs one rank per GPU");
    out.push_back(d);
  }
  if (out.empty()) throw DeviceError("nccl communicator: no devices given");
  return out;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<std::string> split_lines(const std::vector<uint8_t>& b) {
  std::vector<std::string> out;
  std::string cur;
  for (uint8_t c : b) {
    if (c == '\n')
      out.push_back(std::move(cur)), cur.clear();
    else
      cur.push_back(static_cast<char>(c));
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

class NcclCommunicator final : public Communicator {
 public:
  // This process's devices alone: one NCCL rank per device (ncclCommInitAll).
  explicit NcclCommunicator(std::span<Device* const> devices) : devices_(take_devices(devices)) {
    std::vector<int> ordinals;
    for (CudaDevice* d : devices_) ordinals.push_back(d->ordinal());
    total_ = static_cast<int>(devices_.size());
    comms_.resize(devices_.size());
    KILN_NCCL_CHECK(ncclCommInitAll(comms_.data(), static_cast<int>(comms_.size()), ordinals.data()));
  }

  // Every device of every process of `group`: process p's local device r is NCCL rank p * local + r. The processes
  // first agree over the group (device counts, no GPU driven twice), then rank 0's ncclGetUniqueId reaches every
  // process through the group's all_gather, and each process joins its devices with ncclCommInitRank.
  NcclCommunicator(std::span<Device* const> devices, ProcessGroup& group) {
    const std::string where = "nccl communicator across " + std::to_string(group.size()) + " processes";
    // A problem found here is sent to the others instead of thrown at once, so every process stops with it rather
    // than waiting for this one in the next collective.
    std::string problem;
    try {
      devices_ = take_devices(devices);
    } catch (const Error& e) {
      problem = e.what();
      for (char& c : problem)
        if (c == '\n') c = ' ';
    }
    // What each process says: its host, then "!" and its problem, or its device count and each device's label and
    // hardware id (PCI bus id).
    std::string mine = group.host() + "\n" + (problem.empty() ? std::to_string(devices_.size()) : "!" + problem) + "\n";
    for (CudaDevice* d : devices_) mine += d->info().label() + "\t" + d->info().hardware_id + "\n";
    const auto every = group.all_gather(bytes_of(mine));
    const int me = group.rank(), procs = group.size();
    std::vector<std::vector<std::string>> said;
    for (const auto& b : every) said.push_back(split_lines(b));
    auto who = [&](int p) {
      const auto& l = said.at(static_cast<size_t>(p));
      return "rank " + std::to_string(p) + " (host " + (l.empty() ? std::string("?") : l[0]) + ")";
    };
    if (!problem.empty()) throw DeviceError(where + ": " + who(me) + ": " + problem);
    for (int p = 0; p < procs; ++p) {
      const auto& l = said[static_cast<size_t>(p)];
      if (l.size() < 2) throw DeviceError(where + ": " + who(p) + " sent no device list (a Kiln of another version?)");
      if (l[1].starts_with("!")) throw DeviceError(where + ": " + who(p) + " could not take part: " + l[1].substr(1));
    }
    // (host, hardware id) of every device of every process: NCCL cannot have two ranks on one GPU.
    std::map<std::pair<std::string, std::string>, std::pair<int, std::string>> seen;
    for (int p = 0; p < procs; ++p) {
      const auto& l = said[static_cast<size_t>(p)];
      if (l[1] != std::to_string(devices_.size()))
        throw DeviceError(where + ": " + who(p) + " drives " + l[1] + " device(s), " + who(me) + " drives " +
                          std::to_string(devices_.size()) +
                          "; every rank must drive the same number of devices ([strategy] devices)");
      for (size_t i = 2; i < l.size(); ++i) {
        const size_t tab = l[i].find('\t');
        const std::string label = l[i].substr(0, tab), id = tab == std::string::npos ? "" : l[i].substr(tab + 1);
        if (id.empty()) continue;
        auto [it, fresh] = seen.try_emplace({l[0], id}, p, label);
        if (!fresh)
          throw DeviceError(where + ": " + who(it->second.first) + " drives " + it->second.second + " and " + who(p) +
                            " drives " + label + ", the same GPU (" + id +
                            "); NCCL needs one rank per GPU. Give each "
                            "MPI rank on a host its own GPUs, e.g. mpirun -np 2 sh -c 'CUDA_VISIBLE_DEVICES="
                            "$OMPI_COMM_WORLD_LOCAL_RANK exec kiln train run.toml' (docs/scaling.md)");
      }
    }
    // Rank 0's unique id (128 bytes) to everyone, after a marker: "=" and the id, or "!" and why there is none.
    ncclUniqueId id{};
    std::string payload;
    if (me == 0) {
      const ncclResult_t e = ncclGetUniqueId(&id);
      payload = e == ncclSuccess ? "=" + std::string(reinterpret_cast<const char*>(&id), sizeof id)
                                 : "!ncclGetUniqueId failed: " + std::string(ncclGetErrorString(e));
    }
    const auto ids = group.all_gather(bytes_of(payload));
    const auto& root = ids.at(0);
    if (root.size() != 1 + sizeof id || root[0] != '=')
      throw DeviceError(where + ": " + who(0) + " could not create the NCCL unique id" +
                        (root.size() > 1 ? ": " + std::string(root.begin() + 1, root.end()) : std::string()));
    std::memcpy(&id, root.data() + 1, sizeof id);
    const int local = static_cast<int>(devices_.size());
    first_ = me * local;
    total_ = procs * local;
    comms_.resize(devices_.size());
    // One thread joins several devices: each ncclCommInitRank on its device, all in one group (NCCL waits for
    // every rank of every process at ncclGroupEnd).
    KILN_NCCL_CHECK(ncclGroupStart());
    try {
      for (int r = 0; r < local; ++r) {
        devices_[static_cast<size_t>(r)]->activate();
        KILN_NCCL_CHECK(ncclCommInitRank(&comms_[static_cast<size_t>(r)], total_, id, first_ + r));
      }
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    KILN_NCCL_CHECK(ncclGroupEnd());
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
        throw_error(Library::nccl, e, "ncclAllReduce(p, p, count, ncclFloat, ncclSum, comm, stream)", __FILE__,
                    __LINE__);
      }
    }
    KILN_NCCL_CHECK(ncclGroupEnd());
  }

  void broadcast(std::span<const BufferView> bufs, std::span<Device* const> devices, int root) override {
    if (root < 0 || root >= total_)
      throw DeviceError("nccl broadcast: root " + std::to_string(root) + " is not a rank of this " +
                        std::to_string(total_) + "-device communicator");
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
  int first_ = 0;  // NCCL rank of this process's first device
  int total_ = 0;  // NCCL ranks in all (every device of every process)
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::span<Device* const> devices) {
  return std::make_unique<NcclCommunicator>(devices);
}

std::unique_ptr<Communicator> make_nccl_group_communicator(std::span<Device* const> devices, ProcessGroup& group) {
  return std::make_unique<NcclCommunicator>(devices, group);
}

}  // namespace kiln::cuda
