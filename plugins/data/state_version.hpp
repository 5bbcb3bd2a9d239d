// The format version a saved stage state carries after its stage name, for stages that read more than one version
// (StateReader checks one exact version and names the stage on any mismatch).
#pragma once
#include <cstdint>
#include <cstring>

#include "kiln/data.hpp"

namespace kiln::data {

// The version written by StateWriter::tag, or 0 when the state is too short to hold one (StateReader then reports it).
inline uint64_t state_version(const StageState& s) {
  uint64_t n = 0, v = 0;
  if (s.size() < sizeof n) return 0;
  std::memcpy(&n, s.data(), sizeof n);
  if (n > s.size() || s.size() - sizeof n - n < sizeof v) return 0;
  std::memcpy(&v, s.data() + sizeof n + n, sizeof v);
  return v;
}

}  // namespace kiln::data
