// The conformance suite's driver: picks backends and cases, prints a line per case with a repro command for
// every failure, runs the out-of-memory fault injection, and returns the exit code.
#include "kiln/conformance.hpp"

#include <atomic>
#include <chrono>
#include <iostream>
#include <set>

#include "conformance_impl.hpp"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln {

int BackendResult::count(CaseStatus s) const {
  int n = 0;
  for (const auto& c : cases) n += c.status == s;
  return n;
}

int BackendResult::failures() const { return count(CaseStatus::fail) + (validation_messages > 0 ? 1 : 0); }

int ConformanceReport::failures() const {
  int n = 0;
  for (const auto& g : gradients) n += g.status == CaseStatus::fail;
  for (const auto& b : backends) n += b.failures();
  return n;
}

std::vector<OpCase> conformance_cases() { return conformance::all_cases(); }

std::vector<std::pair<std::string, OpKind>> conformance_case_ids() {
  std::vector<std::pair<std::string, OpKind>> v;
  for (const auto& c : conformance::all_cases()) v.emplace_back(c.id, c.kind);
  return v;
}

namespace {

using namespace conformance;

const char* status_word(CaseStatus s) {
  switch (s) {
    case CaseStatus::pass:
      return "PASS";
    case CaseStatus::fail:
      return "FAIL";
    case CaseStatus::unsupported:
      return "UNSUPPORTED";
  }
  return "?";
}

CaseResult result(std::string id, CaseStatus status, std::string detail) {
  CaseResult r;
  r.id = std::move(id);
  r.op = "oom";
  r.status = status;
  r.detail = std::move(detail);
  return r;
}

const OpCase* find_case(const std::vector<OpCase>& all, const std::string& id) {
  for (const auto& c : all)
    if (c.id == id) return &c;
  return nullptr;
}

class BackendRun {
 public:
  BackendRun(Device& dev, BackendResult& r, const ConformanceOptions& o, std::ostream& out,
             const std::vector<OpCase>& all)
      : dev_(dev), r_(r), opts_(o), out_(out), all_(all) {}

  void record(CaseResult cr) {
    out_ << status_word(cr.status) << ' ' << r_.device.label() << ' ' << cr.id;
    if (!cr.detail.empty()) out_ << " -- " << cr.detail;
    if (!cr.relaxation.empty()) out_ << " [relaxed]";
    out_ << " (" << static_cast<int>(cr.seconds * 1000) << " ms)\n";
    if (cr.status == CaseStatus::fail) {
      out_ << "    repro: " << opts_.repro_command << " --backend " << r_.backend << " --device " << opts_.device
           << " --case '" << cr.id << "'\n";
    }
    out_.flush();
    r_.cases.push_back(std::move(cr));
  }

  void run_table(const ToleranceSet& tols) {
    std::set<size_t> printed;
    Allocator alloc(dev_, AllocatorOptions{});
    for (const OpCase& c : all_) {
      if (!opts_.op.empty() && op_name(c.kind) != opts_.op) continue;
      if (!opts_.case_id.empty() && c.id != opts_.case_id) continue;
      if (c.large && !opts_.large && opts_.case_id.empty()) continue;
      std::vector<size_t> applied;
      const Tolerance tol = tolerance_for(c, tols, applied);
      CaseResult cr;
      cr.id = c.id;
      cr.op = std::string(op_name(c.kind));
      for (size_t i : applied) {
        const std::string d = tols.items[i].describe();
        cr.relaxation += (cr.relaxation.empty() ? "" : "; ") + d;
        if (printed.insert(i).second) {
          out_ << "RELAX " << r_.backend << ' ' << d << '\n';
          r_.relaxations_applied.push_back(d);
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      Outcome o;
      try {
        o = run_case(dev_, alloc, c, tol);
      } catch (const OutOfMemory& e) {
        o = {CaseStatus::fail, std::string("out of memory placing the case's buffers: ") + e.what()};
      } catch (const std::exception& e) {
        o = {CaseStatus::fail, std::string("error: ") + e.what()};
      }
      cr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cr.status = o.status;
      cr.detail = o.detail;
      cr.max_abs_err = o.max_abs_err;
      cr.nse = o.nse;
      record(std::move(cr));
    }
  }

  // Every single block request of a case, failed in turn, must give kiln::OutOfMemory and leave the device
  // able to run the next case; a device asked for an impossible block must return nullptr, not throw.
  void fault_injection(const ToleranceSet& tols) {
    const OpCase* health = find_case(all_, "add/257.int");
    for (const char* probe_id : {"adam_update/257.step1", "conv2d_backward_filter/16x8x16x16.k16.r3.p1.float"}) {
      const OpCase* probe = find_case(all_, probe_id);
      std::vector<size_t> unused;
      const Tolerance tol = tolerance_for(*probe, tols, unused);
      AllocatorOptions ao;
      ao.min_block = 256;  // every buffer its own block request
      size_t requests = 0;
      try {
        Allocator a(dev_, ao);
        if (run_case(dev_, a, *probe, tol).status == CaseStatus::unsupported) continue;
        requests = a.stats().block_requests;
      } catch (const std::exception& e) {
        record(result(std::string("oom/") + probe_id, CaseStatus::fail,
                      std::string("the probe case failed without fault injection: ") + e.what()));
        continue;
      }
      for (size_t k = 1; k <= requests; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        CaseResult cr = result("oom/" + std::string(probe_id) + ".fail_block_request_" + std::to_string(k) + "_of_" +
                                   std::to_string(requests),
                               CaseStatus::pass, "kiln::OutOfMemory, device still usable");
        ao.fail_block_request = static_cast<int>(k);
        try {
          Allocator a(dev_, ao);
          run_case(dev_, a, *probe, tol);
          cr.status = CaseStatus::fail;
          cr.detail = "block request " + std::to_string(k) + " was failed, yet no OutOfMemory was thrown";
        } catch (const OutOfMemory&) {
        } catch (const std::exception& e) {
          cr.status = CaseStatus::fail;
          cr.detail = std::string("expected kiln::OutOfMemory, got: ") + e.what();
        }
        if (cr.status == CaseStatus::pass) check_usable(*health, tols, cr);
        cr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        record(std::move(cr));
      }
    }
    CaseResult cr = result("oom/device_refuses_2^62_bytes", CaseStatus::pass, "nullptr, device still usable");
    try {
      if (Block* b = dev_.allocate_block(size_t(1) << 62)) {
        dev_.free_block(b);
        cr.status = CaseStatus::fail;
        cr.detail = "allocate_block(2^62 bytes) returned a block";
      }
    } catch (const std::exception& e) {
      cr.status = CaseStatus::fail;
      cr.detail = std::string("allocate_block(2^62 bytes) threw instead of returning nullptr: ") + e.what();
    }
    if (cr.status == CaseStatus::pass) check_usable(*health, tols, cr);
    record(std::move(cr));
  }

 private:
  void check_usable(const OpCase& health, const ToleranceSet& tols, CaseResult& cr) {
    std::vector<size_t> unused;
    try {
      Allocator a(dev_, AllocatorOptions{});
      const Outcome o = run_case(dev_, a, health, tolerance_for(health, tols, unused));
      if (o.status != CaseStatus::pass) {
        cr.status = CaseStatus::fail;
        cr.detail = "the device is unusable afterwards: " + health.id + ": " + o.detail;
      }
    } catch (const std::exception& e) {
      cr.status = CaseStatus::fail;
      cr.detail = std::string("the device is unusable afterwards: ") + e.what();
    }
  }

  Device& dev_;
  BackendResult& r_;
  const ConformanceOptions& opts_;
  std::ostream& out_;
  const std::vector<OpCase>& all_;
};

void validate(const ConformanceOptions& o, const std::vector<OpCase>& all) {
  if (!o.op.empty() && o.op != "oom") {
    bool known = false;
    std::string all;
    std::string names;
    for (size_t k = 0; k < op_count(); ++k) {
      known |= op_name(static_cast<OpKind>(k)) == o.op;
      names += (names.empty() ? "" : ", ") + std::string(op_name(static_cast<OpKind>(k)));
    }
    if (!known)
      throw ConfigError("conformance: unknown op \"" + o.op + "\"; ops: " + names + ", oom (fault injection)");
  }
  if (!o.case_id.empty() && !find_case(all, o.case_id))
    throw ConfigError("conformance: unknown case \"" + o.case_id +
                      "\"; case ids look like \"gemm/nn.17x33x65.int\" (every FAIL line prints its repro)");
  if (o.device < 0) throw ConfigError("conformance: device index must be >= 0, found " + std::to_string(o.device));
}

// Finite-difference checks of the gradient rules, on the reference: they do not depend on a backend.
void gradient_checks(const std::vector<OpCase>& all, const ConformanceOptions& opts, ConformanceReport& report,
                     std::ostream& out) {
  for (const OpCase& c : all) {
    if (!c.gradcheck) continue;
    if (!opts.op.empty() && op_name(c.kind) != opts.op) continue;
    if (!opts.case_id.empty() && c.id != opts.case_id) continue;
    CaseResult cr;
    cr.id = "gradient/" + c.id;
    cr.op = std::string(op_name(c.kind));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      cr.detail = check_gradient(c);
    } catch (const std::exception& e) {
      cr.detail = std::string("error: ") + e.what();
    }
    cr.status = cr.detail.empty() ? CaseStatus::pass : CaseStatus::fail;
    cr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out << status_word(cr.status) << " reference " << cr.id << (cr.detail.empty() ? "" : " -- " + cr.detail) << " ("
        << static_cast<int>(cr.seconds * 1000) << " ms)\n";
    report.gradients.push_back(std::move(cr));
  }
  if (!report.gradients.empty()) {
    int failed = 0;
    for (const auto& g : report.gradients) failed += g.status == CaseStatus::fail;
    out << "== gradient rules (finite differences on the reference): " << report.gradients.size() - failed
        << " passed, " << failed << " failed\n";
  }
}

}  // namespace

ConformanceReport run_conformance_suite(Registry& registry, const ConformanceOptions& opts, std::ostream& out) {
  const std::vector<OpCase> all = all_cases();
  validate(opts, all);
  std::vector<std::string> names;
  if (opts.backend.empty() || opts.backend == "all") {
    names = registry.backend_names();
  } else {
    registry.backend(opts.backend);  // throws ConfigError listing the registered backends
    names.push_back(opts.backend);
  }
  ConformanceReport report;
  if (opts.gradients) gradient_checks(all, opts, report, out);
  for (const auto& name : names) {
    BackendResult r;
    r.backend = name;
    std::unique_ptr<Backend> backend = registry.backend(name)(opts.backend_options);
    const std::vector<DeviceInfo> devices = backend->enumerate();
    if (opts.device >= static_cast<int>(devices.size())) {
      r.reason = devices.empty() ? backend->unavailable_reason()
                                 : "no device " + std::to_string(opts.device) + " (the backend has " +
                                       std::to_string(devices.size()) + ")";
      if (r.reason.empty()) r.reason = "the backend reports no devices";
      out << "SKIP " << name << " -- " << r.reason << "\n";
      report.backends.push_back(std::move(r));
      continue;
    }
    // A malformed tolerance file is refused before any device is opened.
    const ToleranceSet tols = load_tolerances(opts.tolerance_dir, name);
    std::unique_ptr<Device> dev = backend->open(opts.device);
    r.available = true;
    r.device = dev->info();
    r.tolerance_file = tols.path;
    out << "== " << name << ": " << r.device.label() << " " << r.device.name << " [" << r.device.hardware_id << "]\n"
        << "   tolerances: "
        << (tols.path.empty() ? "no tolerance file; strict defaults, no relaxations"
                              : tols.path + " (" + std::to_string(tols.items.size()) + " relaxations)")
        << "\n";
    BackendRun run(*dev, r, opts, out, all);
    run.run_table(tols);
    if (opts.fault_injection && opts.case_id.empty() && (opts.op.empty() || opts.op == "oom"))
      run.fault_injection(tols);
    dev->synchronize();
    if (void* p = dev->extension(kValidationMessagesExtension)) {
      r.validation_checked = true;
      r.validation_messages = static_cast<std::atomic<uint64_t>*>(p)->load();
      out << (r.validation_messages ? "FAIL " : "PASS ") << r.device.label()
          << " validation layer: " << r.validation_messages << " warnings/errors\n";
    }
    out << "== " << name << ": " << r.count(CaseStatus::pass) << " passed, " << r.count(CaseStatus::fail) << " failed, "
        << r.count(CaseStatus::unsupported) << " unsupported, " << r.relaxations_applied.size()
        << " relaxations applied\n";
    report.backends.push_back(std::move(r));
  }
  return report;
}

int run_conformance(Registry& registry, const ConformanceOptions& opts, std::ostream& out) {
  ConformanceReport report;
  try {
    report = run_conformance_suite(registry, opts, out);
    if (!opts.report_path.empty()) write_conformance_json(report, opts.report_path);
    if (!opts.matrix_path.empty()) write_support_matrix(report, opts.matrix_path);
  } catch (const ConfigError& e) {
    out << "error: " << e.what() << "\n";
    return 2;
  }
  int failures = report.failures();
  // A backend named explicitly must have run: nothing verified is not a pass.
  if (opts.backend != "all" && !opts.backend.empty())
    for (const auto& b : report.backends) failures += b.available ? 0 : 1;
  out << (failures ? "conformance: FAILED (" + std::to_string(failures) + " failures)" : std::string("conformance: OK"))
      << "\n";
  return failures ? 1 : 0;
}

}  // namespace kiln
