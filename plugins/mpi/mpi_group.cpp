// MpiGroup: MPI_Init_thread, host names, and the timed collectives.
#include "mpi_group.hpp"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <sstream>
#include <thread>

#include "kiln/error.hpp"

namespace kiln::mpi {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(std::string("MPI call ") + call + " failed with error " + std::to_string(code) + ": " +
              std::string(text, static_cast<size_t>(len)));
}

namespace {
bool g_finalized_here = false;

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}
}  // namespace

MpiGroup::MpiGroup(const ProcessGroupOptions& o) : o_(o) {
  int inited = 0;
  KILN_MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    if (g_finalized_here) throw Error("mpi: MPI was already finalized in this process; one run per process");
    int provided = 0;
    // Collectives run on the main thread and on data_parallel's communication lane, never at the same time.
    KILN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    if (provided < MPI_THREAD_SERIALIZED)
      throw Error("mpi: this MPI library gives thread level " + std::to_string(provided) +
                  ", Kiln needs MPI_THREAD_SERIALIZED (calls from more than one thread, one at a time)");
  }
  // Errors come back as codes (thrown as kiln::Error) instead of aborting inside MPI.
  KILN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  KILN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  KILN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  KILN_MPI_CHECK(MPI_Get_processor_name(name, &len));
  hosts_.assign(static_cast<size_t>(size_), "?");
  hosts_[static_cast<size_t>(rank_)] = std::string(name, static_cast<size_t>(len));
  const std::string mine = hosts_[static_cast<size_t>(rank_)];
  auto all = all_gather({reinterpret_cast<const uint8_t*>(mine.data()), mine.size()});
  for (size_t r = 0; r < all.size(); ++r) hosts_[r] = std::string(all[r].begin(), all[r].end());
}

MpiGroup::~MpiGroup() {
  int done = 0;
  MPI_Finalized(&done);
  // Finalize waits for every rank: after an error the others may never come, so this process just exits (mpirun
  // then stops the job).
  if (!done && std::uncaught_exceptions() == 0) MPI_Finalize(), g_finalized_here = true;
}

void MpiGroup::wait(std::vector<MPI_Request>& reqs, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (;;) {
    int done = 0;
    KILN_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited > o_.timeout_s) {
      std::string ranks;
      for (int r = 0; r < size_; ++r)
        if (r != rank_)
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(r) + " on " + hosts_[static_cast<size_t>(r)];
      throw Error("mpi: " + std::string(what) +
                  " did not complete within [strategy] timeout_s = " + seconds_text(o_.timeout_s) + " s on rank " +
                  std::to_string(rank_) + " (" + host() + "); one of ranks " + ranks +
                  " stopped taking part (it died, hangs or runs another step). Check that rank's output; raise "
                  "timeout_s for very slow steps");
    }
    // MPI's TCP transport progresses only inside MPI calls, on both ends: poll, yielding the core to the replicas'
    // threads between polls, and sleep only once a collective has waited long (a slow rank, a hang).
    if (waited < 0.001)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::vector<std::vector<uint8_t>> MpiGroup::all_gather(std::span<const uint8_t> mine) {
  std::vector<int> sizes(static_cast<size_t>(size_));
  int n = static_cast<int>(mine.size());
  std::vector<MPI_Request> req(1);
  KILN_MPI_CHECK(MPI_Iallgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, req.data()));
  wait(req, "an all-gather of sizes");
  std::vector<int> displs(static_cast<size_t>(size_), 0);
  int total = 0;
  for (int r = 0; r < size_; ++r) displs[static_cast<size_t>(r)] = total, total += sizes[static_cast<size_t>(r)];
  std::vector<uint8_t> flat(static_cast<size_t>(total));
  KILN_MPI_CHECK(MPI_Iallgatherv(mine.data(), n, MPI_BYTE, flat.data(), sizes.data(), displs.data(), MPI_BYTE,
                                 MPI_COMM_WORLD, req.data()));
  wait(req, "an all-gather");
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const auto* b = flat.data() + displs[static_cast<size_t>(r)];
    out[static_cast<size_t>(r)].assign(b, b + sizes[static_cast<size_t>(r)]);
  }
  return out;
}

void MpiGroup::all_reduce_sum(std::span<float> values) {
  // Small values (losses, checkpoint state): gathered and added in rank order by everyone, so every rank has the same
  // bits.
  auto all = all_gather({reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()});
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.f;
  for (const auto& b : all) {
    if (b.size() != values.size_bytes())
      throw Error("mpi: all_reduce_sum: a rank sent " + std::to_string(b.size()) + " bytes, this rank " +
                  std::to_string(values.size_bytes()));
    const float* f = reinterpret_cast<const float*>(b.data());
    for (size_t i = 0; i < values.size(); ++i) values[i] += f[i];
  }
}

void MpiGroup::sum_floats(float* v, size_t count, const char* what) {
  if (size_ == 1 || count == 0) return;
  if (count > static_cast<size_t>(INT32_MAX))
    throw Error("mpi: a bucket of " + std::to_string(count) + " floats is too large for one MPI call");
  const int n = static_cast<int>(count);
  std::vector<MPI_Request> req(1);
  if (!o_.fixed_order) {
    KILN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req.data()));
    wait(req, what);
    return;
  }
  if (rank_ == 0) gather_.resize(count * static_cast<size_t>(size_));
  KILN_MPI_CHECK(
      MPI_Igather(v, n, MPI_FLOAT, rank_ == 0 ? gather_.data() : nullptr, n, MPI_FLOAT, 0, MPI_COMM_WORLD, req.data()));
  wait(req, what);
  if (rank_ == 0) {
    for (size_t i = 0; i < count; ++i) v[i] = gather_[i];
    for (int r = 1; r < size_; ++r) {
      const float* src = gather_.data() + static_cast<size_t>(r) * count;
      for (size_t i = 0; i < count; ++i) v[i] += src[i];
    }
  }
  KILN_MPI_CHECK(MPI_Ibcast(v, n, MPI_FLOAT, 0, MPI_COMM_WORLD, req.data()));
  wait(req, what);
}

void MpiGroup::broadcast_bytes(void* p, size_t bytes, int root, const char* what) {
  if (size_ == 1 || bytes == 0) return;
  if (bytes > static_cast<size_t>(INT32_MAX))
    throw Error("mpi: a broadcast of " + std::to_string(bytes) + " bytes is too large for one MPI call");
  std::vector<MPI_Request> req(1);
  KILN_MPI_CHECK(MPI_Ibcast(p, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, req.data()));
  wait(req, what);
}

}  // namespace kiln::mpi
