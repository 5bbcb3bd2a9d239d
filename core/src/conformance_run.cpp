// Runs one conformance case on a device: generates inputs, runs the reference, places every buffer inside
// guard regions, runs the op, and checks guards, untouched inputs, NaNs and the tolerance.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "conformance_impl.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"

namespace kiln::conformance {
namespace {

constexpr size_t kGuardBytes = 256;            // before and after every buffer (keeps views 256-aligned)
constexpr uint32_t kGuardBits = 0x7fbadbadu;   // a NaN payload nobody computes

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

void generate(const Gen& g, std::vector<float>& v, std::mt19937& rng, int64_t rows) {
  generate_case_data(g, v, rng, rows);
}

// One device buffer with guard regions: [guard | data | guard].
struct GuardedBuffer {
  Allocation alloc;
  BufferView view;  // the data part
  size_t count = 0;
  std::vector<float> uploaded;  // the whole region as written before the op
  std::vector<float> downloaded;
};

GuardedBuffer place(Allocator& a, const std::vector<float>& data, const std::string& what) {
  GuardedBuffer b;
  b.count = data.size();
  b.alloc = a.allocate(2 * kGuardBytes + b.count * sizeof(float), {MemoryTag::other, "conformance " + what});
  b.view = b.alloc.view();
  b.view.offset += kGuardBytes;
  b.view.bytes = b.count * sizeof(float);
  const size_t g = kGuardBytes / sizeof(float);
  b.uploaded.assign(2 * g + b.count, from_bits(kGuardBits));
  std::copy(data.begin(), data.end(), b.uploaded.begin() + static_cast<std::ptrdiff_t>(g));
  return b;
}

// The first corrupted guard word, or -1.
int64_t guard_damage(const GuardedBuffer& b) {
  const size_t g = kGuardBytes / sizeof(float);
  for (size_t i = 0; i < b.downloaded.size(); ++i) {
    if (i >= g && i < g + b.count) continue;
    if (bits(b.downloaded[i]) != kGuardBits) return static_cast<int64_t>(i < g ? i : i - b.count);
  }
  return -1;
}

}  // namespace

Outcome run_case(Device& dev, Allocator& alloc, const OpCase& c, const Tolerance& tol) {
  Outcome res;
  const Support s = dev.supports(c.kind, c.attrs);
  if (!s.yes) return {CaseStatus::unsupported, s.reason};
  const OpArity ar = op_arity(c.kind, c.attrs);

  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.id)));
  int64_t rows = 0;
  if (const auto* l = std::get_if<LossAttrs>(&c.attrs)) rows = l->rows;
  std::vector<std::vector<float>> in(ar.in.size()), out(ar.out.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i].resize(static_cast<size_t>(ar.in[i]));
    generate(c.in[i], in[i], rng, rows);
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (c.in[i].kind == Gen::max_pool_y) {
      const float* x[] = {in[0].data()};
      float* y[] = {in[i].data()};
      reference_op(OpKind::MaxPoolForward, c.attrs, x, y);
    }
  for (size_t o = 0; o < out.size(); ++o) {
    out[o].resize(static_cast<size_t>(ar.out[o]));
    generate(c.out[o], out[o], rng, rows);
  }
  auto aliased_input = [&](size_t o) -> int {
    for (auto [oo, ii] : c.alias)
      if (static_cast<size_t>(oo) == o) return ii;
    return -1;
  };

  // The reference, in place where the case is.
  std::vector<std::vector<float>> ref_in = in, ref_out = out;
  std::vector<const float*> rin;
  std::vector<float*> rout;
  for (auto& v : ref_in) rin.push_back(v.data());
  for (size_t o = 0; o < ref_out.size(); ++o) {
    const int a = aliased_input(o);
    rout.push_back(a >= 0 ? ref_in[static_cast<size_t>(a)].data() : ref_out[o].data());
  }
  reference_op(c.kind, c.attrs, rin, rout);

  // Device buffers, each inside its guards.
  std::vector<GuardedBuffer> bufs;
  bufs.reserve(in.size() + out.size() + 1);
  OpCall call{c.kind, c.attrs, {}, {}, {}};
  for (size_t i = 0; i < in.size(); ++i) {
    bufs.push_back(place(alloc, in[i], "input " + std::to_string(i)));
    call.in.push_back(bufs.back().view);
  }
  std::vector<size_t> out_buf(out.size());
  for (size_t o = 0; o < out.size(); ++o) {
    const int a = aliased_input(o);
    if (a >= 0) {
      out_buf[o] = static_cast<size_t>(a);
    } else {
      bufs.push_back(place(alloc, out[o], "output " + std::to_string(o)));
      out_buf[o] = bufs.size() - 1;
    }
    call.out.push_back(bufs[out_buf[o]].view);
  }
  const size_t ws = dev.workspace_bytes(call);
  if (ws > 0) {
    bufs.push_back(place(alloc, std::vector<float>((ws + 3) / 4, from_bits(kUnwrittenBits)), "workspace"));
    call.workspace = bufs.back().view;
    call.workspace.bytes = ws;
  }
  for (auto& b : bufs) dev.copy_from_host(b.uploaded.data(), b.alloc.view());

  try {
    check_call(call, dev.info().label());  // the executor's check when it binds: devices trust checked calls
  } catch (const std::exception& e) {
    return {CaseStatus::fail, std::string("the case's call breaks the op's contract: ") + e.what()};
  }
  try {
    dev.run(call);
    for (auto& b : bufs) {
      b.downloaded.resize(b.uploaded.size());
      dev.copy_to_host(b.alloc.view(), b.downloaded.data());
    }
    dev.synchronize();
  } catch (const std::exception& e) {
    return {CaseStatus::fail, std::string("the device claims the op but running it threw: ") + e.what()};
  }

  auto fail = [&](std::string why) {
    res.status = CaseStatus::fail;
    res.detail = std::move(why);
    return res;
  };
  const size_t g = kGuardBytes / sizeof(float);
  for (size_t i = 0; i < bufs.size(); ++i)
    if (int64_t at = guard_damage(bufs[i]); at >= 0)
      return fail("bytes outside buffer " + std::to_string(i) + " were overwritten (guard word " + std::to_string(at) +
                  " of " + std::to_string(g) + " on each side)");
  for (size_t i = 0; i < in.size(); ++i) {
    bool written = false;
    for (auto [o, ii] : c.alias) written |= static_cast<size_t>(ii) == i;
    if (!written && std::memcmp(bufs[i].downloaded.data(), bufs[i].uploaded.data(), bufs[i].uploaded.size() * 4) != 0)
      return fail("input " + std::to_string(i) + " was modified (inputs are read-only)");
  }

  double sq_err = 0, sq_ref = 0, max_ref = 0;
  for (size_t o = 0; o < out.size(); ++o) {
    const int a = aliased_input(o);
    const std::vector<float>& want = a >= 0 ? ref_in[static_cast<size_t>(a)] : ref_out[o];
    const float* got = bufs[out_buf[o]].downloaded.data() + g;
    const std::string where = "output " + std::to_string(o) + " element ";
    for (size_t i = 0; i < want.size(); ++i) {
      const float gv = got[i], wv = want[i];
      if (std::isnan(wv) || std::isnan(gv)) {
        if (bits(gv) == kUnwrittenBits && !std::isnan(wv))
          return fail(where + std::to_string(i) + " was never written (reference " + num(wv) + ")");
        if (std::isnan(wv) != std::isnan(gv))
          return fail(where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) + " (NaN mismatch)");
        continue;
      }
      if (std::isinf(wv) || std::isinf(gv)) {
        if (gv != wv) return fail(where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv));
        continue;
      }
      const double err = std::fabs(double(gv) - double(wv));
      res.max_abs_err = std::max(res.max_abs_err, err);
      sq_err += err * err;
      sq_ref += double(wv) * wv;
      max_ref = std::max(max_ref, std::fabs(double(wv)));
      if (tol.exact && gv != wv)
        return fail(where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) +
                    " (exact: inputs are small integers)");
      if (!tol.exact && c.check == Check::elementwise && err > tol.atol + tol.rtol * std::fabs(double(wv)))
        return fail(where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) + ", error " + num(err) +
                    " > atol " + num(tol.atol) + " + rtol " + num(tol.rtol) + " * |reference|");
    }
  }
  res.nse = sq_ref > 0 ? sq_err / sq_ref : sq_err;
  if (!tol.exact && c.check == Check::reduction) {
    if (res.nse > tol.nse)
      return fail("normalized squared error " + num(res.nse) + " > " + num(tol.nse) + " (max error " +
                  num(res.max_abs_err) + ")");
    if (res.max_abs_err > tol.max_rel * std::max(1.0, max_ref))
      return fail("max error " + num(res.max_abs_err) + " > max_rel " + num(tol.max_rel) + " * max(1, max|reference| = " +
                  num(max_ref) + ")");
  }
  res.detail = describe(tol, c.check);
  return res;
}

}  // namespace kiln::conformance
