// A fixed set of threads that run an indexed task list to completion; the calling thread helps. Used by the
// map stage. Destruction stops and joins every thread.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::data {

class WorkerPool {
 public:
  explicit WorkerPool(size_t threads);  // `threads` helpers besides the caller (0 = run inline)
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs fn(0) .. fn(n - 1), each exactly once, and returns when all are done. The first exception thrown by
  // a task is re-thrown here (after every task has finished).
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void loop();
  void work();

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0, next_ = 0, finished_ = 0, active_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kiln::data
