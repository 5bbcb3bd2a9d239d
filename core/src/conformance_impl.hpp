// Internal to the conformance suite (conformance*.cpp): the case table, tolerances and the case runner.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/conformance.hpp"
#include "kiln/ops.hpp"

namespace kiln::conformance {

// How the data of one buffer is generated (deterministically from the case id).
struct Gen {
  enum Kind : uint8_t {
    sentinel,    // a write-only output: filled with the "never written" NaN pattern
    ints,        // integers in [lo, hi]: sums and products stay exact in f32
    uniform,     // floats uniform in [lo, hi)
    labels,      // class indices in [0, hi) stored as floats
    labels_bad,  // like labels, but row 0 holds the out-of-range class hi
    max_pool_y,  // max_pool_forward of input 0 (for max_pool_backward)
  } kind = sentinel;
  float lo = 0, hi = 0;
};
inline Gen ints(float lo, float hi) { return {Gen::ints, lo, hi}; }
inline Gen uni(float lo, float hi) { return {Gen::uniform, lo, hi}; }
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
};

// The whole table, in a fixed order.
const std::vector<OpCase>& cases();

struct Tolerance {
  bool exact = false;
  double rtol = 0, atol = 0;    // elementwise: |got - ref| <= atol + rtol * |ref|
  double nse = 0, max_rel = 0;  // reduction: sum (got-ref)^2 / sum ref^2 <= nse, max |got-ref| <= max_rel * max(1, max|ref|)
};
// The strict defaults every backend starts from.
Tolerance default_tolerance(const OpCase& c);

// One reviewed loosening from a backend's tolerance file.
struct Relaxation {
  std::string op;            // op name
  std::string case_prefix;   // only cases whose id starts with this (empty: every case of the op)
  std::optional<bool> exact;
  std::optional<double> rtol, atol, nse, max_rel;
  std::string reason;
  std::string where;         // "vulkan.toml:12"
  std::string describe() const;  // "softmax_forward: nse <= 1e-08 (reason) [vulkan.toml:12]"
};
struct ToleranceSet {
  std::string path;  // empty when the backend has no file
  std::vector<Relaxation> items;
};
// Reads <dir>/<backend>.toml (searching the default places when dir is empty). Throws ConfigError with
// file:line for a malformed file, an unknown op, or a relaxation without a reason.
ToleranceSet load_tolerances(const std::string& dir, const std::string& backend);
// The tolerance for a case: the defaults loosened by every matching relaxation (their indices in `applied`).
Tolerance tolerance_for(const OpCase& c, const ToleranceSet& set, std::vector<size_t>& applied);
std::string describe(const Tolerance& t, Check check);  // "exact", "rtol 1e-06 atol 1e-07", "nse 1e-10 max_rel 1e-05"

struct Outcome {
  CaseStatus status = CaseStatus::pass;
  std::string detail;
  double max_abs_err = 0, nse = 0;
};
// Runs one case on `dev` with buffers from `alloc` (guard regions around each), compares with the reference.
// Throws OutOfMemory when the allocator cannot place the buffers; every other problem is a failed Outcome.
Outcome run_case(Device& dev, Allocator& alloc, const OpCase& c, const Tolerance& tol);

}  // namespace kiln::conformance
