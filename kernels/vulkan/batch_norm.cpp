// Batch norm: per-channel statistics and parameter gradients (one workgroup per channel, long channels split over
// dispatches that accumulate, so every invocation stays within the loop budget at any length), then elementwise
// passes for y and dx.
#include <algorithm>
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {

namespace {

constexpr int64_t kLocal = 256;
constexpr int64_t kChunk = kLocal * 16384;  // elements of one channel per dispatch: 16,384 iterations each
constexpr int64_t kTrees = 2 * 8 + 1;       // up to two 8-level tree sums (256 invocations) per channel

// Runs f(c0, c1, e0, e1, groups) over channel spans and element chunks of each channel within the loop budget.
template <class F>
void for_channel_chunks(Encoder& e, int64_t channels, int64_t m, F&& f) {
  const int64_t chunk = std::clamp<int64_t>(m, 1, kChunk);
  const int64_t groups = e.groups_for(channels, 1);
  const int64_t cspan =
      groups * split_loops((channels + groups - 1) / groups, (chunk + kLocal - 1) / kLocal, kTrees).outer;
  for (int64_t c0 = 0; c0 < channels; c0 += cspan) {
    const int64_t c1 = std::min(channels, c0 + cspan);
    int64_t e0 = 0;
    do {
      const int64_t e1 = std::min(m, e0 + chunk);
      f(c0, c1, e0, e1, e.groups_for(c1 - c0, 1));
      e0 = e1;
    } while (e0 < m);
  }
}

struct StatsParams {
  uint32_t C, inner, c0, c1, e0, e1, mode, accumulate, finalize;
  float m, eps, momentum, unbias;
};

void run_batch_norm(Encoder& e, const OpCall& c) {
  const auto& a = std::get<BatchNormAttrs>(c.attrs);
  const int64_t m = a.n * a.inner, total = m * a.c;
  if (a.c == 0) return;
  const double md = static_cast<double>(m);
  if (c.kind == OpKind::BatchNormForward) {
    const float unbias = m > 1 ? static_cast<float>(md / (md - 1)) : 1.f;
    if (a.training) {
      for (uint32_t mode : {0u, 1u})
        for_channel_chunks(e, a.c, m, [&](int64_t c0, int64_t c1, int64_t e0, int64_t e1, uint32_t groups) {
          StatsParams p{
              u32(a.c),          u32(a.inner),           u32(c0), u32(c1),    u32(e0), u32(e1), mode, e0 > 0 ? 1u : 0u,
              e1 == m ? 1u : 0u, static_cast<float>(md), a.eps,   a.momentum, unbias};
          if (mode == 0)
            e.dispatch("batch_norm_stats",
                       {rd(c.in[0]), rw(c.out[1]), unused(c.out[2]), unused(c.out[3]), unused(c.out[4])}, p, groups);
          else
            e.dispatch("batch_norm_stats", {rd(c.in[0]), rd(c.out[1]), rw(c.out[2]), rw(c.out[3]), rw(c.out[4])}, p,
                       groups);
        });
    } else {
      for_channel_chunks(e, a.c, 1, [&](int64_t c0, int64_t c1, int64_t, int64_t, uint32_t groups) {
        StatsParams p{u32(a.c), u32(a.inner),           u32(c0), u32(c1),    0,     0, 2u, 0,
                      0,        static_cast<float>(md), a.eps,   a.momentum, unbias};
        e.dispatch("batch_norm_stats", {unused(c.in[0]), wr(c.out[1]), wr(c.out[2]), rd(c.out[3]), rd(c.out[4])}, p,
                   groups);
      });
    }
    for_ranges(e, total, kLocal, 0, [&](int64_t b, int64_t end, uint32_t groups) {
      struct {
        uint32_t C, inner, begin, end;
      } p{u32(a.c), u32(a.inner), u32(b), u32(end)};
      e.dispatch("batch_norm_forward",
                 {rd(c.in[0]), rd(c.in[1]), rd(c.in[2]), rd(c.out[1]), rd(c.out[2]), wr(c.out[0])}, p, groups);
    });
    return;
  }
  // Backward: in x, gamma, mean, rstd, dy; out dx, dgamma, dbeta.
  for_channel_chunks(
      e, a.c, std::max<int64_t>(m, 1), [&](int64_t c0, int64_t c1, int64_t e0, int64_t e1, uint32_t groups) {
        struct {
          uint32_t C, inner, c0, c1, e0, e1, accumulate;
        } p{u32(a.c), u32(a.inner), u32(c0), u32(c1), u32(e0), u32(m == 0 ? 0 : e1), e0 > 0 ? 1u : 0u};
        auto out = [&](const BufferView& v) { return e0 > 0 ? rw(v) : wr(v); };
        e.dispatch("batch_norm_param_grad",
                   {rd(c.in[0]), rd(c.in[4]), rd(c.in[2]), rd(c.in[3]), out(c.out[1]), out(c.out[2])}, p, groups);
      });
  for_ranges(e, total, kLocal, 0, [&](int64_t b, int64_t end, uint32_t groups) {
    struct {
      uint32_t C, inner, begin, end;
      float m;
      uint32_t training;
    } p{u32(a.c), u32(a.inner), u32(b), u32(end), static_cast<float>(md), a.training ? 1u : 0u};
    e.dispatch(
        "batch_norm_backward",
        {rd(c.in[0]), rd(c.in[4]), rd(c.in[1]), rd(c.in[2]), rd(c.in[3]), rd(c.out[1]), rd(c.out[2]), wr(c.out[0])}, p,
        groups);
  });
}

}  // namespace

KILN_VULKAN_KERNEL("batch_norm_forward", {run_batch_norm});
KILN_VULKAN_KERNEL("batch_norm_backward", {run_batch_norm});

}  // namespace kiln::vulkan
