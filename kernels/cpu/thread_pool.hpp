// The CPU kernels' thread pool. A call is split into chunks that threads claim one at a time; the calling
// thread claims too and returns as soon as every chunk is done. A worker that wakes late (its core busy with
// another process) finds nothing left and delays nobody, unlike an OpenMP region, whose closing barrier
// waits for every thread of the team: on a shared 2-core host that cost a scheduler slice (4-24 ms) per op
// (bench/results/cpu_ops.md). Below the pool: how every kernel cuts its work into chunks (parts_for,
// parallel_ranges).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln::cpu {

class ThreadPool {
 public:
  // `threads` >= 1 threads in all, the caller included (threads - 1 workers). If the system cannot start one,
  // the workers already started are stopped and std::system_error says which thread failed.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs f(chunk, slot) for every chunk in [0, chunks) and returns when all are done.
  // `slot` in [0, size()) names the thread running the chunk (0 = the caller), for per-thread scratch.
  // f must not throw. Calls must not overlap (one caller at a time, as a device's stream guarantees).
  template <class F>
  void run(int64_t chunks, F&& f) {
    using Fn = std::remove_reference_t<F>;
    run_impl(
        chunks, [](void* ctx, int64_t c, int s) { (*static_cast<Fn*>(ctx))(c, s); }, &f);
  }

  static constexpr int64_t kMaxChunks = 0xffff;  // per round; larger calls run in rounds

 private:
  using Call = void (*)(void* ctx, int64_t chunk, int slot);
  void run_impl(int64_t chunks, Call call, void* ctx);
  void claim_all(int slot);
  void worker(int slot, uint32_t seen);
  void wake_sleepers();
  void shutdown();  // stops and joins every started worker

  // (generation << 32) | (chunks << 16) | next chunk: one word, so a claim can never mix two calls.
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> epoch_{0};  // bumped per call and at shutdown
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex sleep_mu_;  // only for workers that stopped spinning
  std::condition_variable wake_;
  Call call_ = nullptr;  // written before the call is published, read only after a successful claim
  void* ctx_ = nullptr;
  int64_t base_ = 0;  // first chunk of the current round
  uint32_t generation_ = 0;
  std::vector<std::thread> workers_;
};

// Below this many elements a kernel runs on the calling thread alone: waking a worker costs more.
inline constexpr int64_t kParallelMin = 32768;

// How many chunks to cut `work` elements into: a few per thread, so a thread that starts late or loses its
// core hands its share to the others; 1 (no pool traffic at all) for small work or a single thread.
inline int64_t parts_for(int64_t work, const ThreadPool& pool) {
  return pool.size() > 1 && work >= kParallelMin ? 4 * static_cast<int64_t>(pool.size()) : 1;
}

// Runs body(begin, end) over [0, n) cut into `parts` contiguous ranges (the same cut whoever runs them, so
// results never depend on timing). parts <= 1 calls body(0, n) on the calling thread, with no pool traffic.
template <class Body>
inline void parallel_ranges(ThreadPool& pool, int64_t n, int64_t parts, Body&& body) {
  if (parts > n) parts = n;
  if (parts > ThreadPool::kMaxChunks) parts = ThreadPool::kMaxChunks;
  if (parts <= 1) {
    body(int64_t{0}, n);
    return;
  }
  pool.run(parts, [&](int64_t c, int) { body(n * c / parts, n * (c + 1) / parts); });
}

}  // namespace kiln::cpu
