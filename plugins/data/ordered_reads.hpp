// Reading a random-access stage's elements in a given order through next(), so the stage can read ahead with its
// own threads (a map stage's workers) instead of its caller asking at() one element at a time. A shuffle over a
// random-access map hands it the epoch's order; a batch stage reading an MPI rank's rows hands down the positions of
// those rows. Stages of this plugin only (found by dynamic_cast).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/data.hpp"

namespace kiln::data {

using Positions = std::shared_ptr<const std::vector<uint32_t>>;

class OrderedReads {
 public:
  virtual ~OrderedReads() = default;
  // Until the next reset() or restore(): next() delivers at(order[i]) for i = from, from + 1, ... to the end of
  // `order`. False when the stage cannot (it has no random access now); nothing changed then.
  virtual bool read_in_order(Positions order, uint64_t from) = 0;
  // Whether next() would then read ahead on threads of its own (a map's workers, here or upstream). Otherwise a
  // caller is as well off reading the positions itself through at() or fill().
  virtual bool reads_ahead() const = 0;
};

inline OrderedReads* ordered_reads(Stage& s) { return dynamic_cast<OrderedReads*>(&s); }

// A hint that fill() will soon be asked for examples ks of the epoch: the batch stage gives the next batch's rows
// right after filling one, so a decoded source starts bringing their bytes into the cache while the trainer's step
// runs (a shuffled epoch reads them from anywhere in a set larger than the cache), and stages that map positions
// (a shuffle, an in-place map) pass it on. It never changes what is read. Stages of this plugin only.
class ReadHints {
 public:
  virtual ~ReadHints() = default;
  virtual void will_read(std::span<const uint64_t> ks) = 0;
};

inline void hint_reads(Stage& s, std::span<const uint64_t> ks) {
  if (auto* h = dynamic_cast<ReadHints*>(&s)) h->will_read(ks);
}

// fill() with every x value multiplied by `factor` (rounded once, as the scale op's x * factor): a map whose only op
// is a scale asks its upstream for this, so a source that converts bytes scales them in the same pass instead of the
// map making a second pass over the batch. False (nothing written) where the upstream cannot; the map then fills and
// scales as usual. Stages of this plugin only.
class ScaledFill {
 public:
  virtual ~ScaledFill() = default;
  virtual bool fill_scaled(std::span<const uint64_t> ks, float* x, float* y, float factor) = 0;
};

}  // namespace kiln::data
