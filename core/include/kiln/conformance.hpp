// The conformance suite: one table of op cases run on any backend's device against the core's reference
// implementation (reference.hpp), with guard regions, NaN checks, per-backend reviewed tolerances and
// out-of-memory fault injection. `kiln conformance` and the test suite both call run_conformance().
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/op_case.hpp"
#include "kiln/plugin.hpp"

namespace kiln {

struct ConformanceOptions {
  std::string backend = "all";  // a registered backend, or "all": every registered backend (those without a
                                // device are reported as skipped)
  int device = 0;               // device index within the backend
  std::string op;               // only cases of this op (op_name, or "oom" for fault injection), empty = all
  std::string case_id;          // only this case (as printed in the repro line), empty = all
  std::string report_path;      // JSON report to write, empty = none
  std::string matrix_path;      // op-support matrix (markdown) to write, empty = none
  // Directory holding <backend>.toml tolerance files. Empty: $KILN_TOLERANCE_DIR, then
  // <exe dir>/../share/kiln/conformance/tolerances. A backend without a file runs with the strict defaults.
  std::string tolerance_dir;
  BackendOptions backend_options;  // the [device] keys the backend reads: BackendOptions::parse("validation = true")
  bool fault_injection = true;     // also run the out-of-memory fault-injection checks
  bool large = true;               // include the large-tensor cases
  bool gradients = true;           // also check every gradient rule by finite differences (cases marked gradcheck)
  std::string repro_command = "kiln conformance";  // how repro lines spell the command
};

enum class CaseStatus : uint8_t { pass, fail, unsupported };

struct CaseResult {
  std::string id;  // "gemm/tn.17x33x65.int"
  std::string op;  // op_name, or "oom" for fault-injection checks
  CaseStatus status = CaseStatus::pass;
  std::string detail;      // failure or unsupported reason; the check applied when passing
  std::string relaxation;  // the tolerance-file entry applied, if any
  double max_abs_err = 0;  // against the reference
  double nse = 0;          // normalized squared error
  double seconds = 0;
};

struct BackendResult {
  std::string backend;
  bool available = false;  // had a device to run on
  std::string reason;      // why not available
  DeviceInfo device;
  std::string tolerance_file;                    // the file read, empty when none
  std::vector<std::string> relaxations_applied;  // "op gemm: nse <= 1e-08 (reason)", printed by the run
  bool validation_checked = false;               // the device answered kValidationMessagesExtension
  uint64_t validation_messages = 0;
  std::vector<CaseResult> cases;
  int count(CaseStatus s) const;
  int failures() const;  // failed cases, plus 1 when validation messages were seen
};

struct ConformanceReport {
  std::vector<BackendResult> backends;
  std::vector<CaseResult> gradients;  // "gradient/<case id>": finite-difference checks on the reference
  int failures() const;
};

// Runs the suite on the chosen backends, printing one line per case (PASS / FAIL / UNSUPPORTED with the
// reason, and a repro command for each failure) and each tolerance relaxation applied. Throws ConfigError for
// an unknown backend, op or case id, or a malformed tolerance file.
ConformanceReport run_conformance_suite(Registry& registry, const ConformanceOptions& opts, std::ostream& out);

// The JSON report: every case of every backend with status, errors and relaxations.
void write_conformance_json(const ConformanceReport& report, const std::string& path);
// The op-support matrix (markdown): one row per op, one column per backend.
void write_support_matrix(const ConformanceReport& report, const std::string& path);

// The app's entry: runs the suite, writes the files asked for and returns the exit code: 0 when everything
// run passed, 1 on any failure (including an op a device claims but cannot run, validation messages, or a
// named backend with no device), 2 on bad options (printed to `out`).
int run_conformance(Registry& registry, const ConformanceOptions& opts, std::ostream& out);

// A gradient rule's finite-difference check on the reference implementation: the op's inputs get random
// values from the case's generators, L = sum_j w_j * out_j for fixed random weights w, and the gradient the
// rule's backward ops compute (run on the reference) must match central differences of L for every input
// the rule differentiates. Returns "" when it matches, else what differs (input, element, both values). The
// suite runs it on every case marked gradcheck (ConformanceOptions::gradients).
std::string check_gradient(const OpCase& c, double eps = 1e-3, double rtol = 2e-2, double atol = 2e-3);

// Every case of the table, plugins' ops included (OpDesc::cases).
std::vector<OpCase> conformance_cases();

// Every case id of the table, with its op (for listings and tests).
std::vector<std::pair<std::string, OpKind>> conformance_case_ids();

}  // namespace kiln
