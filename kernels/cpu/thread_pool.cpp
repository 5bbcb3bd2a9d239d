// ThreadPool: chunks claimed through one atomic word; workers spin briefly between calls, then sleep.
#include "thread_pool.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_CPU_PAUSE() _mm_pause()
#else
#define KILN_CPU_PAUSE() std::this_thread::yield()
#endif

namespace kiln::cpu {
namespace {

// How long an idle worker spins for the next call before it sleeps: ops of a training step follow each
// other within microseconds, and waking a sleeping thread costs tens of microseconds.
constexpr auto kSpin = std::chrono::microseconds(200);

constexpr uint64_t pack(uint64_t gen, uint64_t chunks, uint64_t next) { return (gen << 32) | (chunks << 16) | next; }

}  // namespace

ThreadPool::ThreadPool(int threads) {
  // Each worker starts from the epoch of construction: one that starts late must still see a later bump.
  const uint32_t epoch = epoch_.load();
  // Workers start with the trainer's stop signals (SIGINT, SIGTERM, SIGUSR1, SIGUSR2) blocked (a thread inherits
  // its creator's mask), so those signals go to a thread that is not a worker: the workers run oneDNN's JIT kernels,
  // and a stop signal delivered to a thread inside one of them corrupted the heap (the trainer's stop handler runs
  // on the main thread's alternate signal stack, trainer.cpp).
  sigset_t stop, old;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGUSR1);
  sigaddset(&stop, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &stop, &old);
  try {
    workers_.reserve(static_cast<size_t>(std::max(threads - 1, 0)));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i, epoch] { worker(i, epoch); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  } catch (const std::system_error& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    // The destructor does not run for a constructor that throws: stop the workers already started, or the
    // joinable std::threads left behind call std::terminate.
    const size_t started = workers_.size();
    shutdown();
    throw std::system_error(e.code(), "could not start worker thread " + std::to_string(started + 1) + " of " +
                                          std::to_string(threads - 1) + " (" + e.what() + ")");
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

void ThreadPool::shutdown() {
  stop_.store(true);
  epoch_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::wake_sleepers() {
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  std::lock_guard<std::mutex> lock(sleep_mu_);
  wake_.notify_all();
}

void ThreadPool::claim_all(int slot) {
  uint64_t cur = next_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t chunks = (cur >> 16) & 0xffff, idx = cur & 0xffff;
    if (idx >= chunks) return;
    if (next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      // The claim succeeded, so this call is still running and call_/ctx_ are its own.
      call_(ctx_, base_ + static_cast<int64_t>(idx), slot);
      done_.fetch_add(1, std::memory_order_acq_rel);
      cur = next_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::run_impl(int64_t chunks, Call call, void* ctx) {
  if (chunks <= 0) return;
  if (workers_.empty() || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) call(ctx, c, 0);
    return;
  }
  call_ = call;
  ctx_ = ctx;
  for (int64_t base = 0; base < chunks; base += kMaxChunks) {  // more chunks than one word holds: in rounds
    const int64_t count = std::min(kMaxChunks, chunks - base);
    base_ = base;
    done_.store(0, std::memory_order_relaxed);
    ++generation_;
    next_.store(pack(generation_, static_cast<uint64_t>(count), 0), std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    wake_sleepers();
    claim_all(0);
    // Chunks still running on workers: they hold a core, so a short spin then yielding is enough.
    for (int spins = 0; done_.load(std::memory_order_acquire) < count; ++spins) {
      if (spins < 4096)
        KILN_CPU_PAUSE();
      else
        std::this_thread::yield();
    }
  }
}

void ThreadPool::worker(int slot, uint32_t seen) {
  for (;;) {
    // Spin for a new call, then sleep. sleepers_ and epoch_ are a seq_cst handshake with wake_sleepers():
    // either the caller sees this sleeper and notifies, or this thread sees the new epoch and does not wait.
    auto start = std::chrono::steady_clock::now();
    for (int spins = 0; epoch_.load(std::memory_order_acquire) == seen; ++spins) {
      KILN_CPU_PAUSE();
      if ((spins & 255) == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        std::unique_lock<std::mutex> lock(sleep_mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return epoch_.load(std::memory_order_seq_cst) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        start = std::chrono::steady_clock::now();
      }
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    claim_all(slot);
  }
}

}  // namespace kiln::cpu
