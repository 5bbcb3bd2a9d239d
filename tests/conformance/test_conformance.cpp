// The conformance suite on every backend of this build: the whole op table against the reference, with the
// Vulkan validation layer on (and required to stay silent), plus the out-of-memory fault injection.
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "kiln/conformance.hpp"
#include "test_support.hpp"

namespace {

kiln::ConformanceOptions options_for(const std::string& backend) {
  kiln::ConformanceOptions o;
  o.backend = backend;
  o.tolerance_dir = KILN_SOURCE_DIR "/data/conformance/tolerances";
  if (backend == "vulkan") o.backend_options = kiln::BackendOptions::parse("validation = true");
  o.repro_command = KILN_APP " conformance";
  return o;
}

// Runs the suite on `backend`, printing its lines; nullopt with `why` set when it is absent or has no device.
std::optional<kiln::BackendResult> run_backend(const std::string& backend, kiln::ConformanceOptions o,
                                               std::string& why) {
  auto& reg = kiln::test::registry();
  if (!reg.has_backend(backend)) {
    why = "backend " + backend + " is not built into this tree";
    return std::nullopt;
  }
  std::ostringstream out;
  const kiln::ConformanceReport report = kiln::run_conformance_suite(reg, o, out);
  REQUIRE(report.backends.size() == 1);
  // CI keeps the log and the JSON report of every run: <build>/conformance/<backend>[-<op>].{log,json}
  const auto dir = std::filesystem::path(KILN_BINARY_DIR) / "conformance";
  std::filesystem::create_directories(dir);
  const std::string stem = backend + (o.op.empty() ? "" : "-" + o.op);
  std::ofstream((dir / (stem + ".log")).string()) << out.str();
  kiln::write_conformance_json(report, (dir / (stem + ".json")).string());
  const kiln::BackendResult& r = report.backends[0];
  if (!r.available) {
    why = "backend " + backend + " has no device: " + r.reason;
    return std::nullopt;
  }
  // Failures print their repro lines; the full log goes to the test output when something failed.
  if (r.failures() > 0) FAIL_CHECK(out.str());
  return r;
}

void require_clean(const kiln::BackendResult& r) {
  INFO("backend " << r.backend << " on " << r.device.name);
  CHECK(r.count(kiln::CaseStatus::fail) == 0);
  CHECK(r.validation_messages == 0);
  CHECK(r.validation_checked == (r.backend == "vulkan"));  // the Vulkan runs have the layer on
  // The table covers every op: each op ran at least one case (supported or not).
  for (int k = 0; k < static_cast<int>(kiln::OpKind::Count_); ++k) {
    const std::string op(kiln::op_name(static_cast<kiln::OpKind>(k)));
    int ran = 0;
    for (const auto& c : r.cases) ran += c.op == op && c.status == kiln::CaseStatus::pass;
    INFO("op " << op);
    CHECK(ran > 0);
  }
}

// The whole table on one backend; skipped when it is not built or has no device.
void run_whole_table(const std::string& backend) {
  std::string why;
  auto r = run_backend(backend, options_for(backend), why);
  if (!r) KILN_SKIP(why);
  require_clean(*r);
  // What lavapipe cannot bind (a tensor above maxStorageBufferRange) or walk in one invocation (a row or window
  // past llvmpipe's loop limit) must be reported, not run; so must a 16-bit case in a type the device refuses
  // (Device::supports_dtype's reason, after "<type> storage: ").
  if (backend == "vulkan")
    for (const auto& c : r->cases)
      if (c.status == kiln::CaseStatus::unsupported) {
        INFO(c.id << ": " << c.detail);
        CHECK((c.detail.find("maxStorageBufferRange") != std::string::npos ||
               c.detail.find("loop iterations in one shader invocation") != std::string::npos ||
               c.detail.rfind("bfloat16 storage: ", 0) == 0 || c.detail.rfind("float16 storage: ", 0) == 0));
      }
}

}  // namespace

TEST_CASE("cpu backend passes the whole conformance table", "[conformance][cpu]") { run_whole_table("cpu"); }

TEST_CASE("vulkan backend passes the whole conformance table with the validation layer silent",
          "[conformance][vulkan]") {
  run_whole_table("vulkan");
}

TEST_CASE("cuda backend passes the whole conformance table, or is skipped with the driver's reason",
          "[conformance][cuda]") {
  run_whole_table("cuda");
}

TEST_CASE("failing any single block request gives OutOfMemory and leaves every device usable", "[conformance][oom]") {
  for (const std::string backend : {"cpu", "vulkan", "cuda"}) {
    kiln::ConformanceOptions o = options_for(backend);
    o.op = "oom";
    std::string why;
    auto r = run_backend(backend, o, why);
    if (!r) {
      WARN(why << "; its out-of-memory cases are not run");
      continue;
    }
    INFO("backend " << backend);
    int injected = 0;
    for (const auto& c : r->cases) {
      INFO(c.id << ": " << c.detail);
      CHECK(c.op == "oom");
      CHECK(c.status == kiln::CaseStatus::pass);
      injected += c.id.find(".fail_block_request_") != std::string::npos;
    }
    CHECK(injected >= 6);  // two probe cases of three or more buffers each
  }
}

TEST_CASE("conformance run writes the JSON report and an op-support matrix naming every op", "[conformance]") {
  const auto dir = kiln::test::temp_dir("conformance-files");
  kiln::ConformanceOptions o = options_for("cpu");
  o.op = "gemm";
  o.fault_injection = false;
  o.report_path = (dir / "report.json").string();
  o.matrix_path = (dir / "matrix.md").string();
  std::ostringstream out;
  REQUIRE(kiln::run_conformance(kiln::test::registry(), o, out) == 0);
  std::ifstream jf(o.report_path), mf(o.matrix_path);
  const std::string json((std::istreambuf_iterator<char>(jf)), {}), md((std::istreambuf_iterator<char>(mf)), {});
  CHECK(json.find("\"backend\": \"cpu\"") != std::string::npos);
  CHECK(json.find("\"id\": \"gemm/nn.17x33x65.int\", \"op\": \"gemm\", \"status\": \"pass\"") != std::string::npos);
  CHECK(md.find("| gemm | yes (") != std::string::npos);
  CHECK(md.find("| conv2d_backward_filter | not run |") != std::string::npos);
  // The 16-bit table: gemm's bf16 and f16 cases.
  CHECK(md.find("## 16-bit storage") != std::string::npos);
  CHECK(md.find("| gemm | bf16 yes (") != std::string::npos);
  CHECK(md.find(", f16 yes (") != std::string::npos);
  CHECK(out.str().find("PASS cpu:0 gemm/tt.64x64x64.int -- exact") != std::string::npos);
}

TEST_CASE("conformance refuses unknown backends, ops and cases, and tolerance files without reasons", "[conformance]") {
  auto& reg = kiln::test::registry();
  std::ostringstream out;
  kiln::ConformanceOptions o = options_for("no_such_backend");
  CHECK(kiln::run_conformance(reg, o, out) == 2);
  o = options_for("cpu");
  o.op = "gemmm";
  CHECK(kiln::run_conformance(reg, o, out) == 2);
  CHECK(out.str().find("unknown op \"gemmm\"") != std::string::npos);
  o = options_for("cpu");
  o.case_id = "gemm/nope";
  CHECK(kiln::run_conformance(reg, o, out) == 2);

  const auto dir = kiln::test::temp_dir("conformance-tol");
  std::ofstream(dir / "cpu.toml") << "backend = \"cpu\"\n\n[[relax]]\nop = \"gemm\"\nnse = 1e-6\nreason = \"\"\n";
  o = options_for("cpu");
  o.op = "gemm";
  o.tolerance_dir = dir.string();
  std::ostringstream bad;
  CHECK(kiln::run_conformance(reg, o, bad) == 2);
  CHECK(bad.str().find("cpu.toml:6") != std::string::npos);
  CHECK(bad.str().find("reason") != std::string::npos);

  std::ofstream(dir / "cpu.toml")
      << "backend = \"cpu\"\n[[relax]]\nop = \"gem\"\nnse = 1e-6\nreason = \"long enough reason\"\n";
  std::ostringstream bad_op;
  CHECK(kiln::run_conformance(reg, o, bad_op) == 2);
  CHECK(bad_op.str().find("\"gem\"") != std::string::npos);
}

TEST_CASE("a relaxation in the tolerance file is printed and applied only to the cases it names", "[conformance]") {
  const auto dir = kiln::test::temp_dir("conformance-relax");
  std::ofstream(dir / "cpu.toml") << "backend = \"cpu\"\n[[relax]]\nop = \"softmax_forward\"\ncase = "
                                     "\"softmax_forward/7x\"\nnse = 1e-6\nreason = \"testing the relaxation path\"\n";
  kiln::ConformanceOptions o = options_for("cpu");
  o.op = "softmax_forward";
  o.tolerance_dir = dir.string();
  std::ostringstream out;
  const auto report = kiln::run_conformance_suite(kiln::test::registry(), o, out);
  REQUIRE(report.backends.size() == 1);
  const auto& r = report.backends[0];
  REQUIRE(r.relaxations_applied.size() == 1);
  CHECK(r.relaxations_applied[0].find("testing the relaxation path") != std::string::npos);
  CHECK(out.str().find("RELAX cpu softmax_forward (cases softmax_forward/7x*): nse 1e-06") != std::string::npos);
  for (const auto& c : r.cases) CHECK(c.relaxation.empty() == (c.id.rfind("softmax_forward/7x", 0) != 0));
}

TEST_CASE("cpu backend passes the conformance table on 1 and 3 threads", "[conformance][cpu]") {
  // The kernels split work by thread count: tails and partial sums differ between team sizes.
  for (int threads : {1, 3}) {
    kiln::ConformanceOptions o = options_for("cpu");
    o.backend_options = kiln::BackendOptions::parse("threads = " + std::to_string(threads));
    o.large = false;
    o.fault_injection = false;
    o.gradients = false;
    INFO("threads " << threads);
    std::string why;
    auto r = run_backend("cpu", o, why);
    if (!r) KILN_SKIP(why);
    require_clean(*r);
  }
}
