// The conformance suite must catch a broken backend: a host device that runs the reference and then breaks
// one rule (writes past its output, leaves an element unwritten, produces a NaN, changes an input, throws on an
// op it claims, or throws instead of refusing a block) gets a FAIL naming the problem and a repro line.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>

#include "kiln/conformance.hpp"
#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

namespace {

enum class Defect { none, past_the_end, unwritten, nan, input_changed, throws, wrong_value, throwing_allocation };

class BrokenDevice final : public kiln::Device {
 public:
  explicit BrokenDevice(Defect d) : defect_(d) {
    info_.backend = "broken";
    info_.name = "host device with a defect";
    info_.hardware_id = "test";
    info_.total_memory = info_.free_memory = size_t(1) << 30;
    // Device::supports asks the registry for the op's kernel on this backend: every op has one, so it says yes
    // (run() below is this device's own, with its defect; the registered kernels are never run).
    for (size_t k = 0; k < kiln::op_count(); ++k)
      if (!kiln::find_kernel("broken", static_cast<kiln::OpKind>(k)))
        kiln::register_kernel("broken", static_cast<kiln::OpKind>(k), kiln::HostKernel{});
  }
  const kiln::DeviceInfo& info() const override { return info_; }
  kiln::Block* allocate_block(size_t bytes) override {
    if (bytes > (size_t(1) << 40)) {
      if (defect_ == Defect::throwing_allocation) throw std::bad_alloc();
      return nullptr;
    }
    auto* b = new kiln::Block{new char[bytes], nullptr, bytes, ++ids_};
    return b;
  }
  void free_block(kiln::Block* b) noexcept override {
    delete[] static_cast<char*>(b->ptr);
    delete b;
  }
  void synchronize() override {}

 protected:
  void do_copy_from_host(const void* src, const kiln::BufferView& dst) override {
    std::memcpy(dst.host(), src, dst.bytes);
  }
  void do_copy_to_host(const kiln::BufferView& src, void* dst) override { std::memcpy(dst, src.host(), src.bytes); }
  void do_copy_on_device(const kiln::BufferView& src, const kiln::BufferView& dst) override {
    std::memcpy(dst.host(), src.host(), src.bytes);
  }
  bool runs_kernel(const kiln::Kernel& k) const override { return k.get<kiln::HostKernel>() != nullptr; }
  kiln::Support do_supports(kiln::OpKind, const kiln::OpAttrs&, const kiln::OpArity&,
                            const kiln::Kernel&) const override {
    return {};
  }
  bool do_run(const kiln::OpCall& c) override {
    if (defect_ == Defect::throws) throw kiln::DeviceError("broken: this kernel is missing");
    const kiln::OpArity ar = kiln::op_arity(c.kind, c.attrs);
    const float last = ar.out[0] > 0 ? c.out[0].host()[ar.out[0] - 1] : 0.f;
    std::vector<const float*> in;
    std::vector<float*> out;
    for (const auto& v : c.in) in.push_back(v.host());
    for (const auto& v : c.out) out.push_back(v.host());
    kiln::reference_op(c.kind, c.attrs, in, out);
    if (ar.out[0] == 0) return true;
    switch (defect_) {
      case Defect::past_the_end:
        c.out[0].host()[ar.out[0]] = 1.f;
        break;
      case Defect::unwritten:
        c.out[0].host()[ar.out[0] - 1] = last;
        break;
      case Defect::nan:
        c.out[0].host()[0] = std::numeric_limits<float>::quiet_NaN();
        break;
      case Defect::input_changed:
        c.in[0].host()[0] += 1.f;
        break;
      case Defect::wrong_value:
        c.out[0].host()[ar.out[0] / 2] += 0.5f;
        break;
      default:
        break;
    }
    return true;
  }

 private:
  Defect defect_;
  kiln::DeviceInfo info_;
  uint64_t ids_ = 0;
};

class BrokenBackend final : public kiln::Backend {
 public:
  explicit BrokenBackend(Defect d) : defect_(d) {}
  std::string name() const override { return "broken"; }
  std::vector<kiln::DeviceInfo> enumerate() override { return {BrokenDevice(defect_).info()}; }
  std::unique_ptr<kiln::Device> open(int) override { return std::make_unique<BrokenDevice>(defect_); }

 private:
  Defect defect_;
};

// Runs the add cases (or the fault injection) on a broken device; returns the output.
std::string run_broken(Defect d, const std::string& op, kiln::BackendResult* result = nullptr) {
  kiln::Registry reg;
  reg.add_backend("broken", [d](const kiln::BackendOptions&) { return std::make_unique<BrokenBackend>(d); });
  kiln::ConformanceOptions o;
  o.backend = "broken";
  o.op = op;
  o.tolerance_dir = kiln::test::temp_dir("broken-tol").string();
  o.fault_injection = op == "oom";
  o.large = false;
  std::ostringstream out;
  const auto report = kiln::run_conformance_suite(reg, o, out);
  if (result) *result = report.backends.at(0);
  return out.str();
}

}  // namespace

TEST_CASE("conformance passes a host device that runs the reference faithfully", "[conformance][harness]") {
  kiln::BackendResult r;
  const std::string out = run_broken(Defect::none, "add", &r);
  INFO(out);
  CHECK(r.count(kiln::CaseStatus::fail) == 0);
  CHECK(r.count(kiln::CaseStatus::pass) > 10);
}

TEST_CASE("conformance fails a device that writes past its output, naming the guard region", "[conformance][harness]") {
  const std::string out = run_broken(Defect::past_the_end, "add");
  CHECK(out.find("FAIL broken:0 add/1.int -- bytes outside buffer 2 were overwritten") != std::string::npos);
  CHECK(out.find("repro: kiln conformance --backend broken --device 0 --case 'add/1.int'") != std::string::npos);
}

TEST_CASE("conformance fails a device that leaves an output element unwritten", "[conformance][harness]") {
  const std::string out = run_broken(Defect::unwritten, "add");
  CHECK(out.find("FAIL broken:0 add/257.int -- output 0 element 256 was never written") != std::string::npos);
}

TEST_CASE("conformance fails NaN where the reference has none", "[conformance][harness]") {
  const std::string out = run_broken(Defect::nan, "add");
  CHECK(out.find("FAIL broken:0 add/3.int -- output 0 element 0: got nan, reference") != std::string::npos);
  CHECK(out.find("(NaN mismatch)") != std::string::npos);
}

TEST_CASE("conformance fails a device that modifies an input", "[conformance][harness]") {
  const std::string out = run_broken(Defect::input_changed, "add");
  CHECK(out.find("FAIL broken:0 add/3.int -- input 0 was modified") != std::string::npos);
}

TEST_CASE("conformance fails an exact case off by half, and an op the device claims but cannot run",
          "[conformance][harness]") {
  const std::string wrong = run_broken(Defect::wrong_value, "add");
  CHECK(wrong.find("(exact: inputs are small integers)") != std::string::npos);
  kiln::BackendResult r;
  const std::string thrown = run_broken(Defect::throws, "mul", &r);
  CHECK(thrown.find("the device claims the op but running it threw: broken: this kernel is missing") !=
        std::string::npos);
  CHECK(r.count(kiln::CaseStatus::pass) == 0);
  CHECK(r.failures() == r.count(kiln::CaseStatus::fail));
}

TEST_CASE("conformance fails a device that throws instead of refusing an impossible block",
          "[conformance][harness][oom]") {
  kiln::BackendResult r;
  const std::string out = run_broken(Defect::throwing_allocation, "oom", &r);
  CHECK(out.find("FAIL broken:0 oom/device_refuses_2^62_bytes -- allocate_block(2^62 bytes) threw") !=
        std::string::npos);
  // The injected block failures themselves are handled by the core Allocator: those pass.
  CHECK(r.count(kiln::CaseStatus::fail) == 1);
}
