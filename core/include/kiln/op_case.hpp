// One conformance case of an op: attributes, how each buffer's data is generated, and how results are compared.
// The core's table holds the built-in ops' cases; a plugin's op brings its own through OpDesc::cases.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ops.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// How the data of one buffer is generated (deterministically from the case id).
struct Gen {
  enum Kind : uint8_t {
    sentinel,    // a write-only output: filled with the "never written" NaN pattern
    ints,        // integers in [lo, hi]: sums and products stay exact in f32
    uniform,     // floats uniform in [lo, hi)
    labels,      // class indices in [0, hi) stored as floats
    labels_bad,  // like labels, but row 0 holds the out-of-range class hi
    max_pool_y,  // max_pool_forward of input 0 (for max_pool_backward)
    spread,      // distinct values lo + (hi-lo)*(j+0.5)/n in a random order: no ties, none at the midpoint
                 // (finite differences stay clear of max-pool ties and relu's kink)
  } kind = sentinel;
  float lo = 0, hi = 0;
};
inline Gen ints(float lo, float hi) { return {Gen::ints, lo, hi}; }
inline Gen uni(float lo, float hi) { return {Gen::uniform, lo, hi}; }
inline Gen spread(float lo, float hi) { return {Gen::spread, lo, hi}; }
inline const Gen kOut{};

// How outputs are compared when they are not exact: elementwise rtol/atol, or (for reductions, GEMM and
// convolutions) normalized squared error plus a cap on the largest error.
enum class Check : uint8_t { elementwise, reduction };

struct OpCase {
  std::string id;  // "<op>/<variant>", stable: used in repro lines and tolerance files
  OpKind kind{};
  OpAttrs attrs;
  std::vector<Gen> in, out;  // out: kOut for write-only outputs, data for read-write ones
  Check check = Check::elementwise;
  bool exact = false;  // inputs are small integers: every output must equal the reference bit for bit
  std::vector<std::pair<int, int>> alias;  // (output, input) sharing one buffer: the op runs in place
  bool large = false;
  bool gradcheck = false;  // also check the op's gradient rule on this case by finite differences
  // Storage types of the buffers (empty or shorter: float32). A 16-bit buffer's data is generated, rounded to its
  // type and uploaded in it; the reference sees the rounded values and its outputs are rounded likewise.
  std::vector<DType> in_dtype, out_dtype;
};

// The "never written" NaN pattern sentinel outputs are filled with.
inline constexpr uint32_t kUnwrittenBits = 0x7fc0deadu;

}  // namespace kiln
