// Internal to the conformance suite (conformance*.cpp): the case table, tolerances and the case runner.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/conformance.hpp"
#include "kiln/op_case.hpp"
#include "kiln/ops.hpp"

namespace kiln {

// Fills `v` as `g` says (sentinel: the "never written" NaN pattern; max_pool_y: left to the caller). `rows` is
// the number of label rows (labels_bad). Deterministic for a given rng state. Shared by the case runner and the
// gradient check (op_gradcheck.cpp).
void generate_case_data(const Gen& g, std::vector<float>& v, std::mt19937& rng, int64_t rows);

}  // namespace kiln

namespace kiln::conformance {

using kiln::Check;
using kiln::Gen;
using kiln::ints;
using kiln::kOut;
using kiln::OpCase;
using kiln::uni;

// Every op's cases (OpDesc::cases: a built-in op's come from its family's file, core/ops/<family>.cpp), in op kind
// order, each op's in the order it lists them.
std::vector<OpCase> all_cases();

struct Tolerance {
  bool exact = false;
  double rtol = 0, atol = 0;  // elementwise: |got - ref| <= atol + rtol * |ref|
  double nse = 0,
         max_rel = 0;  // reduction: sum (got-ref)^2 / sum ref^2 <= nse, max |got-ref| <= max_rel * max(1, max|ref|)
};
// The strict defaults every backend starts from.
Tolerance default_tolerance(const OpCase& c);

// One reviewed loosening from a backend's tolerance file.
struct Relaxation {
  std::string op;           // op name
  std::string case_prefix;  // only cases whose id starts with this (empty: every case of the op)
  std::optional<bool> exact;
  std::optional<double> rtol, atol, nse, max_rel;
  std::string reason;
  std::string where;             // "vulkan.toml:12"
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

// Unit roundoff of a storage type: 2^-p for p significant bits (float32 2^-24, float16 2^-11, bfloat16 2^-8).
double unit_roundoff(DType t);
// The tolerance for an output stored in t: the float32 one (defaults and relaxations) plus what rounding both the
// device's and the reference's float32 results to t can add. Exact stays exact.
Tolerance widen_for(const Tolerance& tol, DType t);

struct Outcome {
  CaseStatus status = CaseStatus::pass;
  std::string detail;
  double max_abs_err = 0, nse = 0;
};
// Runs one case on `dev` with buffers from `alloc` (guard regions around each), compares with the reference.
// Throws OutOfMemory when the allocator cannot place the buffers; every other problem is a failed Outcome.
Outcome run_case(Device& dev, Allocator& alloc, const OpCase& c, const Tolerance& tol);

}  // namespace kiln::conformance
