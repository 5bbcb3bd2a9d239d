// loss.cpp: the size of the per-range double sums the losses write (sum_squares, clip.cpp, too). The device holds
// them (CpuDevice::partials); each range's sum sits on a cache line of its own.
#pragma once
#include <cstddef>

namespace kiln::cpu {

// Doubles for `threads` threads: one line of 8 per range parts_for cuts (4 per thread).
inline constexpr size_t loss_partials(int threads) { return static_cast<size_t>(4 * threads) * 8; }

}  // namespace kiln::cpu
