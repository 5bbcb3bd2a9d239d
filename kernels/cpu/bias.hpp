// bias.cpp: the bias gradient's per-plane sums, which a fused max-pool backward (pool.cpp, fusion.cpp) computes
// while each plane of dx is in cache.
#pragma once
#include <cstdint>

#include "kiln/ops.hpp"

namespace kiln::cpu {

// bias_grad with inner > 1 sums each (outer, channel) plane with bias_plane_sum (one function, so a fused kernel
// that calls it gets the same bits), then the planes of a channel in outer order in double.
float bias_plane_sum(const float* p, int64_t count);
// The same sum of a plane of bf16 values (their bits in uint16_t), widened in registers: bias_grad's sum on bf16 dy.
float bias_plane_sum(const uint16_t* p, int64_t count);
// The same db from the planes' sums (sums[o * channels + c]), computed elsewhere with bias_plane_sum.
void bias_grad_from_plane_sums(const BiasAttrs& a, const float* sums, float* db);

}  // namespace kiln::cpu
