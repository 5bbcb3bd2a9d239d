// Tolerances of the conformance suite: strict defaults, loosened only by a backend's reviewed tolerance file
// (data/conformance/tolerances/<backend>.toml) where every relaxation carries its reason.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "conformance_impl.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"

namespace kiln::conformance {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

bool known_op(const std::string& name) {
  if (find_op(name)) return true;
  return false;
}

}  // namespace

Tolerance default_tolerance(const OpCase& c) {
  Tolerance t;
  t.exact = c.exact;
  // f32 elementwise results within a few ulps of the correctly rounded value.
  t.rtol = 1e-6;
  t.atol = 1e-7;
  // f32 accumulation of up to ~1e5 terms against a double-precision reference.
  t.nse = 1e-10;
  t.max_rel = 1e-5;
  return t;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::bf16:
      return 0x1p-8;
    case DType::f16:
      return 0x1p-11;
    case DType::f32:
      break;
  }
  return 0x1p-24;
}

// The device's and the reference's float32 results, g and r, agree within the float32 tolerance; rounded to t
// they can land on neighbouring values when a rounding boundary lies between them: |rt(g) - rt(r)| <= |g - r| + one
// ulp of t, and one ulp is at most 2u |rt(r)| (or float16's subnormal spacing 2^-24 near zero). So elementwise
// rtol grows by 2u and atol by the subnormal spacing; a reduction's max_rel by 2u and its normalized squared error
// by u^2 (one element in four a whole ulp off: flips happen only where g and r straddle a boundary, which float32
// accumulation makes rare; a kernel that accumulates in t drifts far past it over a long row).
Tolerance widen_for(const Tolerance& tol, DType t) {
  if (t == DType::f32 || tol.exact) return tol;
  const double u = unit_roundoff(t);
  Tolerance w = tol;
  w.rtol += 2 * u;
  w.atol += t == DType::f16 ? 0x1p-24 : 0.0;
  w.max_rel += 2 * u;
  w.nse += u * u;
  return w;
}

std::string describe(const Tolerance& t, Check check) {
  if (t.exact) return "exact";
  if (check == Check::elementwise) return "rtol " + fmt(t.rtol) + " atol " + fmt(t.atol);
  return "nse " + fmt(t.nse) + " max_rel " + fmt(t.max_rel);
}

std::string Relaxation::describe() const {
  std::string s = op + (case_prefix.empty() ? "" : " (cases " + case_prefix + "*)") + ":";
  if (exact) s += std::string(" exact=") + (*exact ? "true" : "false");
  if (rtol) s += " rtol " + fmt(*rtol);
  if (atol) s += " atol " + fmt(*atol);
  if (nse) s += " nse " + fmt(*nse);
  if (max_rel) s += " max_rel " + fmt(*max_rel);
  return s + " -- " + reason + " [" + where + "]";
}

ToleranceSet load_tolerances(const std::string& dir, const std::string& backend) {
  std::vector<std::string> dirs;
  if (!dir.empty()) {
    dirs.push_back(dir);
  } else {
    if (const char* env = std::getenv("KILN_TOLERANCE_DIR")) dirs.emplace_back(env);
    if (const std::string e = exe_dir(); !e.empty()) dirs.push_back(e + "/../share/kiln/conformance/tolerances");
  }
  ToleranceSet set;
  for (const auto& d : dirs) {
    const std::string path = d + "/" + backend + ".toml";
    if (std::filesystem::exists(path)) {
      set.path = path;
      break;
    }
  }
  if (set.path.empty()) return set;

  const Config cfg = Config::load_file(set.path);
  const ConfigNode root = cfg.root();
  const std::string declared = root.get_string("backend");
  if (declared != backend)
    root.fail("backend", "this file is for backend \"" + backend + "\", found \"" + declared + "\"");
  const std::string file = std::filesystem::path(set.path).filename().string();
  for (const ConfigNode& r : root.table_array("relax")) {
    Relaxation x;
    x.op = r.get_string("op");
    if (!known_op(x.op))
      r.fail("op", "expected an op name of ops.hpp (\"gemm\", \"conv2d_forward\", ...), found \"" + x.op + "\"");
    x.case_prefix = r.get_string("case", "");
    if (!x.case_prefix.empty() && x.case_prefix.rfind(x.op + "/", 0) != 0)
      r.fail("case", "expected a case id prefix starting with \"" + x.op + "/\", found \"" + x.case_prefix + "\"");
    if (r.has("exact")) x.exact = r.get_bool("exact", true);
    auto num = [&](const char* key, std::optional<double>& dst) {
      if (!r.has(key)) return;
      dst = r.get_float(key);
      if (!(*dst >= 0)) r.fail(key, "expected a tolerance >= 0, found " + fmt(*dst));
    };
    num("rtol", x.rtol);
    num("atol", x.atol);
    num("nse", x.nse);
    num("max_rel", x.max_rel);
    x.reason = r.get_string("reason");
    if (x.reason.size() < 10)
      r.fail("reason", "every relaxation needs a reason a reviewer can check, found \"" + x.reason + "\"");
    if (!x.exact && !x.rtol && !x.atol && !x.nse && !x.max_rel)
      r.fail("op", "a relaxation must set at least one of exact, rtol, atol, nse, max_rel");
    const std::string w = r.where("op");  // "file:line: key '...'"
    x.where = w.substr(0, w.find(": key"));
    if (x.where.find(file) == std::string::npos) x.where = file;
    r.finish();
    set.items.push_back(std::move(x));
  }
  root.finish();
  return set;
}

Tolerance tolerance_for(const OpCase& c, const ToleranceSet& set, std::vector<size_t>& applied) {
  Tolerance t = default_tolerance(c);
  const std::string op(op_name(c.kind));
  for (size_t i = 0; i < set.items.size(); ++i) {
    const Relaxation& r = set.items[i];
    if (r.op != op || c.id.rfind(r.case_prefix, 0) != 0) continue;
    // An exact relaxation only matters to exact cases and a numeric one only to inexact comparisons.
    const bool relaxes_exact = r.exact && !*r.exact && t.exact;
    if (relaxes_exact) t.exact = false;
    if (t.exact && !relaxes_exact) continue;
    bool used = relaxes_exact;
    auto loosen = [&](double& dst, const std::optional<double>& v) {
      if (v && *v > dst) {
        dst = *v;
        used = true;
      }
    };
    if (c.check == Check::elementwise) {
      loosen(t.rtol, r.rtol);
      loosen(t.atol, r.atol);
    } else {
      loosen(t.nse, r.nse);
      loosen(t.max_rel, r.max_rel);
    }
    if (used) applied.push_back(i);
  }
  return t;
}

}  // namespace kiln::conformance
