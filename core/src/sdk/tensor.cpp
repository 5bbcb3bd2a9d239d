#include "kiln/tensor.hpp"

#include "kiln/error.hpp"

namespace kiln {

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  if (dims_.size() == 1) s += ",";
  return s + ")";
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (auto d : dims_)
    if (__builtin_mul_overflow(n, d, &n))
      throw ConfigError("tensor shape " + str() +
                        " has more elements than a 64-bit count holds; a size in the config (a layer's units or "
                        "filters, [train] batch_size, [model] input_shape) is far too large");
  return n;
}

bool Shape::fits() const {
  int64_t n = static_cast<int64_t>(dtype_size(DType::f32));
  for (auto d : dims_)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxTensorBytes) return false;
  return true;
}

}  // namespace kiln

namespace kiln {
const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      return "float32";
  }
}
}  // namespace kiln
