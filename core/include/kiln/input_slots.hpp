// Double-buffered device input for one DeviceState: which input slot holds which prefetched batch.
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/executor.hpp"

namespace kiln {

// Runners keep one per device state. The trainer hands batch k+1 to Runner::prefetch before step k; the runner
// calls prefetch() here, which starts copying it (Device::upload_async) into the slot step k does not read. Step k+1
// then calls acquire(), which orders that copy before its ops, or copies a batch that was not prefetched now.
class InputSlots {
 public:
  // `slots`: 1 (no prefetch: acquire() copies every batch) or 2.
  InputSlots(DeviceState& state, int slots);
  ~InputSlots();  // waits for uploads still in flight
  InputSlots(const InputSlots&) = delete;
  InputSlots& operator=(const InputSlots&) = delete;

  int slots() const { return slots_; }
  // Starts copying `e` into a free input slot of `ex`, an executor built with PlanOptions::input_slots == slots().
  // `key` identifies the batch `e` is (part of): the storage of the whole batch's features, which survives a move.
  // `e` must stay alive until acquire() for it returns. Does nothing with one slot, or when no slot is free.
  void prefetch(Executor& ex, const Element& e, const void* key);
  // The input slot `ex` reads in the step on `e`: the one prefetch() filled for `key` (its copy is then ordered
  // before every op enqueued after this call), or a free slot `e` is copied into now.
  int acquire(Executor& ex, const Element& e, const void* key);
  // Waits for every upload in flight and forgets them: before anything that may move the input region (a new
  // executor on the state) or read slot 0 outside training (evaluation).
  void drain() noexcept;

 private:
  struct Pending {
    const void* key = nullptr;
    Executor* ex = nullptr;
    int slot = 0;
    uint64_t generation = 0;  // DeviceState::generation() at upload: a moved region voids the copy
    std::vector<uint64_t> tickets;
  };
  int free_slot() const;  // a slot no pending upload holds, round robin after the last one used; -1 if none
  DeviceState& state_;
  int slots_;
  std::deque<Pending> pending_;
  int last_slot_;
};

}  // namespace kiln
