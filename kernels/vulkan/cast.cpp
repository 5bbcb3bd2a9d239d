// Cast: float32 <-> bfloat16/float16 storage and between the two 16-bit types (cast.comp); equal types are a copy.
// record_cast is also the conversion the dispatch runs around float32-only kernels (dispatch.cpp).
#include <variant>

#include "kernel_support.hpp"

namespace kiln::vulkan {

void record_cast(Encoder& e, const BufferView& src, DType from, const BufferView& dst, DType to, int64_t count) {
  if (count <= 0) return;
  if (from == to) {
    BufferView s = src;
    s.bytes = storage_bytes(count, from);
    return e.copy(s, dst);
  }
  struct {
    uint32_t count, from, to, begin, end;
  } p{u32(count), static_cast<uint32_t>(from), static_cast<uint32_t>(to), 0, 0};
  const int64_t pairs = (count + 1) / 2;  // one invocation per 32-bit word of 16-bit values
  for_ranges(e, pairs, 256, 2, [&](int64_t b, int64_t end, uint32_t groups) {
    p.begin = u32(b);
    p.end = u32(end);
    e.dispatch("cast", {rd(src), wr(dst)}, p, groups);
  });
}

namespace {

void run_cast(Encoder& e, const OpCall& c) {
  const auto& a = std::get<CastAttrs>(c.attrs);
  record_cast(e, c.in[0], a.from, c.out[0], a.to, a.count);
}

}  // namespace

KILN_VULKAN_KERNEL("cast", {.run = run_cast, .takes_types = [](const OpCall&, const DeviceLimits&) { return true; }});

}  // namespace kiln::vulkan
