// Shapes, dtypes and host tensors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

// Storage types. Arithmetic is float32 everywhere; bf16 and f16 are how activations are stored (and what matrix
// products and convolutions read) under a 16-bit precision policy ([precision] compute).
enum class DType : uint8_t { f32, bf16, f16 };

inline constexpr size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
// "float32", "bfloat16", "float16": the names the config uses.
const char* dtype_name(DType t);
// Bytes a tensor of `numel` elements of type t takes, rounded up to a multiple of 4 (a 16-bit tensor of odd length
// ends on a whole 32-bit word, so kernels that move 16-bit pairs never touch a neighbour's bytes).
inline constexpr size_t storage_bytes(int64_t numel, DType t) {
  return (static_cast<size_t>(numel) * dtype_size(t) + 3) / 4 * 4;
}

// The largest tensor Kiln plans or allocates: 2^48 bytes (256 TiB). Beyond any device, and small enough that the
// planner's sums of tensor sizes cannot overflow 64 bits. Larger shapes are config errors (a size far too large).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

// A row-major shape; dims are >= 0. A scalar has no dims.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims_(d) {}
  explicit Shape(std::vector<int64_t> d) : dims_(std::move(d)) {}

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t& operator[](size_t i) { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of the dims. Throws ConfigError (naming the shape) when it does not fit in int64_t.
  int64_t numel() const;
  // Whether a float32 tensor of this shape is at most kMaxTensorBytes (no overflow on the way, no negative dim).
  bool fits() const;
  // The shape without its first (batch) dim.
  Shape tail() const { return Shape(std::vector<int64_t>(dims_.begin() + (dims_.empty() ? 0 : 1), dims_.end())); }
  // The shape with `n` prepended as batch dim.
  Shape with_batch(int64_t n) const {
    std::vector<int64_t> d{n};
    d.insert(d.end(), dims_.begin(), dims_.end());
    return Shape(std::move(d));
  }
  bool operator==(const Shape&) const = default;
  std::string str() const;  // "(32, 1, 28, 28)"

 private:
  std::vector<int64_t> dims_;
};

// A dense f32 tensor in host memory (data stages, checkpoints, tests).
struct HostTensor {
  Shape shape;
  std::vector<float> data;

  HostTensor() = default;
  explicit HostTensor(Shape s, float v = 0.f) : shape(std::move(s)), data(static_cast<size_t>(shape.numel()), v) {}
  size_t bytes() const { return data.size() * sizeof(float); }
};

}  // namespace kiln
