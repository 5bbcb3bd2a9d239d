// Lanes: one thread per device (or replica) of a strategy, so every device's stream is driven at the same time (lane
// 0 is the thread calling run(), the others are persistent workers), plus the signalling the lanes of one step use
// to wait for each other without hanging when one fails.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::parallel {

// Thrown inside a lane whose wait was cut short because another lane failed. run() never rethrows it.
struct Aborted {};

class Lanes {
 public:
  // `names[i]` names lane i in errors ("replica 1 (cpu:1)").
  explicit Lanes(std::vector<std::string> names);
  ~Lanes();
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  int size() const { return static_cast<int>(names_.size()); }
  // Calls fn(i) on every lane i at once and returns when all have returned. When any lane throws, the others'
  // waits end with Aborted, and the first failure is rethrown here with the failing lane's name in front (same
  // kiln error type).
  void run(const std::function<void(int lane)>& fn);

  // For lanes inside run(): blocks until pred() holds (checked under the lock), or throws Aborted once another
  // lane has failed. Returns the seconds spent waiting.
  double wait(const std::function<bool()>& pred);
  // Applies `update` under the lock and wakes every waiting lane.
  void signal(const std::function<void()>& update);

 private:
  void loop(int lane);
  void work(const std::function<void(int)>& fn, int lane);
  std::vector<std::string> names_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_, sync_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  bool failed_ = false;
  int failed_lane_ = -1;
  std::exception_ptr error_;
};

// Rethrows `e` as the same kind of kiln error with `prefix` in front of its message.
[[noreturn]] void rethrow_with_prefix(std::exception_ptr e, const std::string& prefix);

}  // namespace kiln::parallel
