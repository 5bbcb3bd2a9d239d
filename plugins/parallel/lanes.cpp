// Lanes: persistent worker threads with failure propagation (no lane is left waiting when another fails).
#include "lanes.hpp"

#include <chrono>

#include "kiln/allocator.hpp"
#include "kiln/error.hpp"

namespace kiln::parallel {

Lanes::Lanes(std::vector<std::string> names) : names_(std::move(names)) {
  threads_.reserve(names_.size());
  for (int i = 1; i < size(); ++i) threads_.emplace_back([this, i] { loop(i); });  // lane 0 is the caller of run()
}

Lanes::~Lanes() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Lanes::work(const std::function<void(int)>& fn, int lane) {
  try {
    fn(lane);
  } catch (const Aborted&) {
    // another lane failed first; its error is the one reported
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_) {
      failed_ = true;
      failed_lane_ = lane;
      error_ = std::current_exception();
    }
    sync_cv_.notify_all();
  }
}

void Lanes::loop(int lane) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
    }
    work(*fn, lane);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--running_ == 0) done_cv_.notify_all();
    }
  }
}

void Lanes::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    failed_ = false;
    failed_lane_ = -1;
    error_ = nullptr;
    running_ = size() - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  work(fn, 0);  // the calling thread is lane 0: one thread hand-off fewer per run
  std::exception_ptr err;
  int lane = -1;
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return running_ == 0; });
    fn_ = nullptr;
    err = error_;
    lane = failed_lane_;
    error_ = nullptr;
  }
  if (err)
    rethrow_with_prefix(err, names_.at(static_cast<size_t>(lane)) + " failed, so every lane of the step was stopped: ");
}

double Lanes::wait(const std::function<bool()>& pred) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  sync_cv_.wait(lk, [&] { return failed_ || pred(); });
  if (failed_) throw Aborted{};
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Lanes::signal(const std::function<void()>& update) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    update();
  }
  sync_cv_.notify_all();
}

void rethrow_with_prefix(std::exception_ptr e, const std::string& prefix) {
  try {
    std::rethrow_exception(e);
  } catch (const OutOfMemory& x) {
    throw OutOfMemory(prefix + x.what(), x.requested(), x.stats());
  } catch (const ConfigError& x) {
    throw ConfigError(prefix + x.what());
  } catch (const DataError& x) {
    throw DataError(prefix + x.what());
  } catch (const NumericError& x) {
    throw NumericError(prefix + x.what());
  } catch (const PluginError& x) {
    throw PluginError(prefix + x.what());
  } catch (const DeviceError& x) {
    throw DeviceError(prefix + x.what());
  } catch (const Error& x) {
    throw Error(prefix + x.what());
  } catch (const std::exception& x) {
    throw DeviceError(prefix + x.what());
  } catch (...) {
    throw DeviceError(prefix + "an unknown exception");
  }
}

}  // namespace kiln::parallel
