// The "mpi" process group: MPI_COMM_WORLD's ranks, collectives that never wait past the group's timeout, and the
// hierarchical communicator data_parallel uses across processes.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/strategy.hpp"

namespace kiln::mpi {

// Every MPI call goes through this: a failure names the call, the error code and MPI's text.
#define KILN_MPI_CHECK(call) ::kiln::mpi::check_mpi((call), #call)
void check_mpi(int code, const char* call);

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(const ProcessGroupOptions& o);
  ~MpiGroup() override;  // MPI_Finalize, unless an exception is unwinding (the job is then aborted by mpirun)
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string host() const override { return hosts_[static_cast<size_t>(rank_)]; }
  std::vector<std::vector<uint8_t>> all_gather(std::span<const uint8_t> mine) override;
  void all_reduce_sum(std::span<float> values) override;
  std::unique_ptr<Communicator> communicator(std::span<Device* const> devices) override;

  // Sums `v` over the ranks with non-blocking calls: MPI's all-reduce, or with fixed_order a gather to rank 0 that
  // adds in rank order and a broadcast back (the same bits for any MPI build and rank placement).
  void sum_floats(float* v, size_t count, const char* what);
  // Rank `root`'s bytes to every rank.
  void broadcast_bytes(void* p, size_t bytes, int root, const char* what);
  // Waits for `reqs`, polling; past the timeout throws Error naming the operation and every rank's host.
  void wait(std::vector<MPI_Request>& reqs, const char* what);
  const std::string& host_of(int rank) const { return hosts_.at(static_cast<size_t>(rank)); }
  const ProcessGroupOptions& options() const { return o_; }

 private:
  ProcessGroupOptions o_;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;  // per rank
  std::vector<float> gather_;       // fixed_order: rank 0's receive buffer
};

}  // namespace kiln::mpi
