// Cooperative memory reservations: every Kiln process records the memory limit it promises to stay within, per
// device, in a lock file keyed by the device's hardware id. Other Kiln processes on the host see the promise,
// `select = "most_free_memory"` accounts for it, and a job whose limit cannot be honoured refuses at start.
//
// Layout: <root>/<hardware id>/<pid>-<n>.json, root = $KILN_RESERVATION_DIR or /tmp/kiln-reservations
// (KILN_RESERVATION_DIR=off disables reservations). The holder keeps its file flock()ed; a file nobody holds
// is stale (its process died) and is removed by the next process that looks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.hpp"

namespace kiln {

struct ReservationHolder {
  int64_t pid = 0;
  std::string user;
  std::string command;  // the holder's command line (shortened)
  std::string run;      // the holder's [run] name, when it recorded one
  std::string device;   // label when it reserved, e.g. "cuda:1"
  size_t bytes = 0;
  int64_t start_time = 0;  // seconds since the epoch
  // "pid 4242 (alice, run \"big\", `kiln train big.toml`, 2.00 GiB of cuda:0 since 2024-05-01 12:00:03)"
  std::string describe() const;
};

// The reservation directory, or "" when reservations are disabled.
std::string reservation_root();

// Every live reservation on the device with this hardware id (this process's own included). Stale files are
// removed on the way.
std::vector<ReservationHolder> live_reservations(const std::string& hardware_id,
                                                 const std::string& root = reservation_root());
size_t total_bytes(const std::vector<ReservationHolder>& holders);

// One reservation held by this process (RAII: the file is unlocked and removed on destruction).
class Reservation {
 public:
  // Checks, under the directory lock, that `bytes` plus every live reservation of others fits `capacity`
  // (normally the device's total memory), then records it with the run's name `run` (may be empty). Throws
  // DeviceError naming the holders otherwise.
  static std::unique_ptr<Reservation> acquire(const DeviceInfo& device, size_t bytes, size_t capacity,
                                              const std::string& root = reservation_root(),
                                              const std::string& run = "");
  ~Reservation();
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  size_t bytes() const { return holder_.bytes; }
  const std::string& file() const { return file_; }

 private:
  Reservation() = default;
  int fd_ = -1;
  std::string dir_, file_;
  ReservationHolder holder_;
};

// A message naming the holders: "  pid 4242 (alice, `kiln train big.toml`, 2.00 GiB since ...)\n" per line.
std::string format_holders(const std::vector<ReservationHolder>& holders);

}  // namespace kiln
