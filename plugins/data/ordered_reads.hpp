// Reading a random-access stage's elements in a given order through next(), so the stage can read ahead with its
// own threads (a map stage's workers) instead of its caller asking at() one element at a time. A shuffle over a
// random-access map hands it the epoch's order; a batch stage reading an MPI rank's rows hands down the positions of
// those rows. Stages of this plugin only (found by dynamic_cast).
#pragma once
#include <cstdint>
#include <memory>
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

}  // namespace kiln::data
