#include "worker_pool.hpp"

namespace kiln::data {

WorkerPool::WorkerPool(size_t threads) {
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

// Claims task indices until none is left; records the first exception.
void WorkerPool::work() {
  for (;;) {
    size_t i;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_) return;
      i = next_++;
    }
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++finished_ == n_) done_.notify_all();
    }
  }
}

void WorkerPool::loop() {
  unsigned long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    work();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_all();
    }
  }
}

void WorkerPool::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (threads_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  work();
  std::exception_ptr err;
  {
    // Wait for every task and for every helper to leave work(), so fn_ is not used after we return.
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return finished_ == n_ && active_ == 0; });
    fn_ = nullptr;
    n_ = 0;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace kiln::data
