// Bulk conversions between float32 and 16-bit storage (kiln/half.hpp has the scalar ones).
#include "kiln/half.hpp"

#include <cstring>

namespace kiln {

void to_float(const void* src, DType from, float* dst, size_t n) {
  if (n == 0) return;  // the pointers of empty buffers may be null, which memcpy must not see
  if (from == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(s[i], from);
}
void from_float(const float* src, void* dst, DType to, size_t n) {
  if (n == 0) return;
  if (to == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_half(src[i], to);
}
}  // namespace kiln
