// Double-buffered device input: see kiln/input_slots.hpp.
#include "kiln/input_slots.hpp"

#include <algorithm>

namespace kiln {

InputSlots::InputSlots(DeviceState& state, int slots)
    : state_(state), slots_(std::max(1, slots)), last_slot_(std::max(1, slots) - 1) {}

InputSlots::~InputSlots() { drain(); }

void InputSlots::drain() noexcept {
  for (auto& p : pending_)
    for (auto t : p.tickets) {
      try {
        state_.context().device->wait_upload(t);
      } catch (...) {  // a broken device: the error surfaced (or will) on the op stream; nothing to free here
      }
    }
  pending_.clear();
}

int InputSlots::free_slot() const {
  for (int k = 1; k <= slots_; ++k) {
    const int s = (last_slot_ + k) % slots_;
    bool held = false;
    for (const auto& p : pending_) held = held || p.slot == s;
    if (!held) return s;
  }
  return -1;
}

void InputSlots::prefetch(Executor& ex, const Element& e, const void* key) {
  if (slots_ < 2 || ex.input_slots() < slots_ || e.x.data.empty()) return;
  const int slot = free_slot();
  if (slot < 0) return;  // both slots taken: acquire() will copy this batch itself
  // The copy into `slot` is ordered after every op enqueued so far, the step that last read it included.
  Pending p{key, &ex, slot, state_.generation(), {}};
  p.tickets = ex.upload_batch(e, slot);
  pending_.push_back(std::move(p));
}

int InputSlots::acquire(Executor& ex, const Element& e, const void* key) {
  Device* dev = state_.context().device;
  if (!pending_.empty() && pending_.front().key == key && pending_.front().ex == &ex) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    for (auto t : p.tickets) dev->wait_upload(t);
    last_slot_ = p.slot;
    if (p.generation != state_.generation()) ex.load_batch(e, p.slot);  // its region moved since: copy again
    return p.slot;
  }
  if (ex.input_slots() < slots_) {  // a single-slot executor reads slot 0, which an upload may be filling
    drain();
    ex.load_batch(e, 0);
    return 0;
  }
  int slot = free_slot();
  if (slot < 0) {
    drain();
    slot = free_slot();
  }
  last_slot_ = slot;
  ex.load_batch(e, slot);
  return slot;
}

}  // namespace kiln
