// Runs one conformance case on a device: generates inputs, runs the reference, places every buffer inside
// guard regions, runs the op, and checks guards, untouched inputs, NaNs and the tolerance.
//
// 16-bit buffers (OpCase::in_dtype/out_dtype): the generated floats are rounded to the buffer's type before anything
// sees them, so the reference computes on exactly the values the device reads; the buffer is uploaded in its type
// (storage_bytes of it, BufferView::dtype set), downloaded and widened to float32 for the comparison, and the
// reference's outputs are rounded to their buffers' types. The tolerance grows by what that one rounding can add
// (widen_for below); exact cases stay exact: a float32-exact result rounded once has one right answer.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "conformance_impl.hpp"
#include "kiln/half.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"

namespace kiln::conformance {
namespace {

constexpr size_t kGuardBytes = 256;           // before and after every buffer (keeps views 256-aligned)
constexpr uint32_t kGuardBits = 0x7fbadbadu;  // a NaN payload nobody computes
// The "never written" pattern of 16-bit outputs: signalling NaNs (quiet bit clear), which no conversion produces.
constexpr uint16_t kUnwrittenBf16 = 0x7fad, kUnwrittenF16 = 0x7cad;
uint16_t unwritten16(DType t) { return t == DType::f16 ? kUnwrittenF16 : kUnwrittenBf16; }

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

// One device buffer with guard regions: [guard | data | guard], the data part storage_bytes(count, dtype) long
// (a 16-bit buffer of odd length ends in 2 bytes of padding the op may write: they belong to the buffer).
struct GuardedBuffer {
  Allocation alloc;
  BufferView view;  // the data part
  size_t count = 0;
  DType dtype = DType::f32;
  std::vector<uint32_t> uploaded;  // the whole region as written before the op, in 32-bit words
  std::vector<uint32_t> downloaded;
  size_t data_words() const { return storage_bytes(static_cast<int64_t>(count), dtype) / 4; }
  // The data part as float32: 16-bit values widened, the 16-bit "never written" pattern as the float32 one.
  std::vector<float> values() const {
    std::vector<float> v(count);
    const char* p = reinterpret_cast<const char*>(downloaded.data()) + kGuardBytes;
    if (dtype == DType::f32) {
      if (count) std::memcpy(v.data(), p, count * 4);  // an empty vector's data() may be null
      return v;
    }
    to_float(p, dtype, v.data(), count);
    const uint16_t never = unwritten16(dtype);
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (h == never) v[i] = from_bits(kUnwrittenBits);
    }
    return v;
  }
};

GuardedBuffer place(Allocator& a, const std::vector<float>& data, DType t, const std::string& what) {
  GuardedBuffer b;
  b.count = data.size();
  b.dtype = t;
  const size_t bytes = storage_bytes(static_cast<int64_t>(b.count), t);
  b.alloc = a.allocate(2 * kGuardBytes + bytes, {MemoryTag::other, "conformance " + what});
  b.view = b.alloc.view();
  b.view.offset += kGuardBytes;
  b.view.bytes = bytes;
  b.view.dtype = t;
  const size_t g = kGuardBytes / 4;
  b.uploaded.assign(2 * g + bytes / 4, kGuardBits);
  char* p = reinterpret_cast<char*>(b.uploaded.data()) + kGuardBytes;
  if (t == DType::f32) {
    if (b.count) std::memcpy(p, data.data(), b.count * 4);  // an empty vector's data() may be null
  } else {
    std::memset(p, 0, bytes);
    from_float(data.data(), p, t, b.count);  // the values are already rounded to t: this is exact
    const uint16_t never = unwritten16(t);
    for (size_t i = 0; i < b.count; ++i)
      if (bits(data[i]) == kUnwrittenBits) std::memcpy(p + 2 * i, &never, 2);
  }
  return b;
}

// The first corrupted guard word, or -1.
int64_t guard_damage(const GuardedBuffer& b) {
  const size_t g = kGuardBytes / 4, n = b.data_words();
  for (size_t i = 0; i < b.downloaded.size(); ++i) {
    if (i >= g && i < g + n) continue;
    if (b.downloaded[i] != kGuardBits) return static_cast<int64_t>(i < g ? i : i - n);
  }
  return -1;
}

DType type_of(const std::vector<DType>& types, size_t i) { return i < types.size() ? types[i] : DType::f32; }

// Rounds every value but the NaNs (sentinels keep their pattern) to t.
void round_all(std::vector<float>& v, DType t) {
  if (t == DType::f32) return;
  for (auto& x : v)
    if (!std::isnan(x)) x = round_to(x, t);
}

// The input whose buffer output o is written over (OpCase::alias), or -1.
int aliased_input(const OpCase& c, size_t o) {
  for (auto [oo, ii] : c.alias)
    if (static_cast<size_t>(oo) == o) return ii;
  return -1;
}

// A case's generated inputs and outputs (what the device gets), and the same after the reference ran in place (an
// output aliased to an input is in ref_in).
struct CaseData {
  std::vector<std::vector<float>> in, out;
  std::vector<std::vector<float>> ref_in, ref_out;
};

// The inputs and outputs from the case's generators, seeded by the case's id.
CaseData generate_data(const OpCase& c, const OpArity& ar) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.id)));
  int64_t rows = 0;
  if (const auto* l = std::get_if<LossAttrs>(&c.attrs)) rows = l->rows;
  CaseData d;
  d.in.resize(ar.in.size());
  d.out.resize(ar.out.size());
  for (size_t i = 0; i < d.in.size(); ++i) {
    d.in[i].resize(static_cast<size_t>(ar.in[i]));
    generate(c.in[i], d.in[i], rng, rows);
    round_all(d.in[i], type_of(c.in_dtype, i));
  }
  for (size_t i = 0; i < d.in.size(); ++i)
    if (c.in[i].kind == Gen::max_pool_y) {  // from the rounded x: its maxima are values of x, so already rounded
      const float* x[] = {d.in[0].data()};
      float* y[] = {d.in[i].data()};
      reference_op(OpKind::MaxPoolForward, c.attrs, x, y);
      round_all(d.in[i], type_of(c.in_dtype, i));
    }
  for (size_t o = 0; o < d.out.size(); ++o) {
    d.out[o].resize(static_cast<size_t>(ar.out[o]));
    generate(c.out[o], d.out[o], rng, rows);
    round_all(d.out[o], type_of(c.out_dtype, o));  // read-write outputs start from values of their type
  }
  return d;
}

// The reference, in place where the case is.
void run_reference(const OpCase& c, CaseData& d) {
  d.ref_in = d.in;
  d.ref_out = d.out;
  std::vector<const float*> rin;
  std::vector<float*> rout;
  for (auto& v : d.ref_in) rin.push_back(v.data());
  for (size_t o = 0; o < d.ref_out.size(); ++o) {
    const int a = aliased_input(c, o);
    rout.push_back(a >= 0 ? d.ref_in[static_cast<size_t>(a)].data() : d.ref_out[o].data());
  }
  reference_op(c.kind, c.attrs, rin, rout);
  // What the device can store: the reference's float32 results rounded to each output's type.
  for (size_t o = 0; o < d.ref_out.size(); ++o) {
    const int a = aliased_input(c, o);
    round_all(a >= 0 ? d.ref_in[static_cast<size_t>(a)] : d.ref_out[o], type_of(c.out_dtype, o));
  }
}

// The case on the device: every buffer inside its guards (inputs, the outputs not aliased to an input, the
// workspace), uploaded, and the call that reads and writes them.
struct DeviceCase {
  std::vector<GuardedBuffer> bufs;
  OpCall call;
  std::vector<size_t> out_buf;  // output o's buffer
};

DeviceCase place_case(Device& dev, Allocator& alloc, const OpCase& c, const CaseData& d) {
  DeviceCase dc;
  dc.bufs.reserve(d.in.size() + d.out.size() + 1);
  dc.call = OpCall{c.kind, c.attrs, {}, {}, {}};
  for (size_t i = 0; i < d.in.size(); ++i) {
    dc.bufs.push_back(place(alloc, d.in[i], type_of(c.in_dtype, i), "input " + std::to_string(i)));
    dc.call.in.push_back(dc.bufs.back().view);
  }
  dc.out_buf.resize(d.out.size());
  for (size_t o = 0; o < d.out.size(); ++o) {
    const int a = aliased_input(c, o);
    if (a >= 0) {
      dc.out_buf[o] = static_cast<size_t>(a);
    } else {
      dc.bufs.push_back(place(alloc, d.out[o], type_of(c.out_dtype, o), "output " + std::to_string(o)));
      dc.out_buf[o] = dc.bufs.size() - 1;
    }
    dc.call.out.push_back(dc.bufs[dc.out_buf[o]].view);
  }
  const size_t ws = dev.workspace_bytes(dc.call);
  if (ws > 0) {
    dc.bufs.push_back(
        place(alloc, std::vector<float>((ws + 3) / 4, from_bits(kUnwrittenBits)), DType::f32, "workspace"));
    dc.call.workspace = dc.bufs.back().view;
    dc.call.workspace.bytes = ws;
  }
  for (auto& b : dc.bufs) dev.copy_from_host(b.uploaded.data(), b.alloc.view());
  return dc;
}

// Checks the call, runs it and downloads every buffer; what went wrong, or "" when nothing did.
std::string run_on_device(Device& dev, DeviceCase& dc) {
  try {
    check_call(dc.call, dev.info().label());  // the executor's check when it binds: devices trust checked calls
  } catch (const std::exception& e) {
    return std::string("the case's call breaks the op's contract: ") + e.what();
  }
  try {
    dev.run(dc.call);
    for (auto& b : dc.bufs) {
      b.downloaded.resize(b.uploaded.size());
      dev.copy_to_host(b.alloc.view(), b.downloaded.data());
    }
    dev.synchronize();
  } catch (const std::exception& e) {
    return std::string("the device claims the op but running it threw: ") + e.what();
  }
  return {};
}

// Writes where the op may not write: over a guard word, or into an input not aliased to an output. "" when none.
std::string stray_writes(const OpCase& c, const std::vector<GuardedBuffer>& bufs, size_t inputs) {
  const size_t g = kGuardBytes / 4;
  for (size_t i = 0; i < bufs.size(); ++i)
    if (int64_t at = guard_damage(bufs[i]); at >= 0)
      return "bytes outside buffer " + std::to_string(i) + " were overwritten (guard word " + std::to_string(at) +
             " of " + std::to_string(g) + " on each side)";
  for (size_t i = 0; i < inputs; ++i) {
    bool written = false;
    for (auto [o, ii] : c.alias) written |= static_cast<size_t>(ii) == i;
    if (!written && std::memcmp(bufs[i].downloaded.data(), bufs[i].uploaded.data(), bufs[i].uploaded.size() * 4) != 0)
      return "input " + std::to_string(i) + " was modified (inputs are read-only)";
  }
  return {};
}

// Sums over every finite output element compared so far.
struct ErrorSums {
  double sq_err = 0, sq_ref = 0, max_ref = 0;
};

// Compares output o's `got` with the reference's `want` element by element, adding to `sums` and res.max_abs_err;
// the first element that fails, or "" when none does.
std::string compare_output(size_t o, const float* got, const std::vector<float>& want, const OpCase& c,
                           const Tolerance& tol, DType t, ErrorSums& sums, Outcome& res) {
  const std::string where = "output " + std::to_string(o) + " element ";
  const std::string in_type = t == DType::f32 ? "" : std::string(" (") + dtype_name(t) + " output)";
  for (size_t i = 0; i < want.size(); ++i) {
    const float gv = got[i], wv = want[i];
    if (std::isnan(wv) || std::isnan(gv)) {
      if (bits(gv) == kUnwrittenBits && !std::isnan(wv))
        return where + std::to_string(i) + " was never written (reference " + num(wv) + ")";
      if (std::isnan(wv) != std::isnan(gv))
        return where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) + " (NaN mismatch)";
      continue;
    }
    if (std::isinf(wv) || std::isinf(gv)) {
      if (gv != wv) return where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv);
      continue;
    }
    const double err = std::fabs(double(gv) - double(wv));
    res.max_abs_err = std::max(res.max_abs_err, err);
    sums.sq_err += err * err;
    sums.sq_ref += double(wv) * wv;
    sums.max_ref = std::max(sums.max_ref, std::fabs(double(wv)));
    if (tol.exact && gv != wv)
      return where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) +
             " (exact: inputs are small integers)" + in_type;
    if (!tol.exact && c.check == Check::elementwise && err > tol.atol + tol.rtol * std::fabs(double(wv)))
      return where + std::to_string(i) + ": got " + num(gv) + ", reference " + num(wv) + ", error " + num(err) +
             " > atol " + num(tol.atol) + " + rtol " + num(tol.rtol) + " * |reference|" + in_type;
  }
  return {};
}

// A reduction's whole-output check: the normalized squared error and the largest error. "" when both pass.
std::string reduction_error(const Outcome& res, const Tolerance& tol, double max_ref) {
  if (res.nse > tol.nse)
    return "normalized squared error " + num(res.nse) + " > " + num(tol.nse) + " (max error " + num(res.max_abs_err) +
           ")";
  if (res.max_abs_err > tol.max_rel * std::max(1.0, max_ref))
    return "max error " + num(res.max_abs_err) + " > max_rel " + num(tol.max_rel) +
           " * max(1, max|reference| = " + num(max_ref) + ")";
  return {};
}

}  // namespace

Outcome run_case(Device& dev, Allocator& alloc, const OpCase& c, const Tolerance& tol) {
  Outcome res;
  const Support s = dev.supports(c.kind, c.attrs);
  if (!s.yes) return {CaseStatus::unsupported, s.reason};
  // A storage type the device refuses is not supported, whatever the op: the executor refuses such a graph too.
  DType lowest = DType::f32;  // the coarsest type among the outputs (bf16 before f16)
  for (const auto* types : {&c.in_dtype, &c.out_dtype})
    for (DType t : *types) {
      if (t == DType::f32) continue;
      if (const Support st = dev.supports_dtype(t); !st.yes)
        return {CaseStatus::unsupported, std::string(dtype_name(t)) + " storage: " + st.reason};
    }
  for (DType t : c.out_dtype)
    if (unit_roundoff(t) > unit_roundoff(lowest)) lowest = t;
  const OpArity ar = op_arity(c.kind, c.attrs);
  CaseData d = generate_data(c, ar);
  run_reference(c, d);
  DeviceCase dc = place_case(dev, alloc, c, d);
  if (std::string why = run_on_device(dev, dc); !why.empty()) return {CaseStatus::fail, why};

  auto fail = [&](std::string why) {
    res.status = CaseStatus::fail;
    res.detail = std::move(why);
    return res;
  };
  if (std::string why = stray_writes(c, dc.bufs, d.in.size()); !why.empty()) return fail(why);
  ErrorSums sums;
  for (size_t o = 0; o < d.out.size(); ++o) {
    const int a = aliased_input(c, o);
    const std::vector<float>& want = a >= 0 ? d.ref_in[static_cast<size_t>(a)] : d.ref_out[o];
    const std::vector<float> got = dc.bufs[dc.out_buf[o]].values();
    const DType t = type_of(c.out_dtype, o);
    if (std::string why = compare_output(o, got.data(), want, c, widen_for(tol, t), t, sums, res); !why.empty())
      return fail(why);
  }
  res.nse = sums.sq_ref > 0 ? sums.sq_err / sums.sq_ref : sums.sq_err;
  const Tolerance whole = widen_for(tol, lowest);
  if (!whole.exact && c.check == Check::reduction)
    if (std::string why = reduction_error(res, whole, sums.max_ref); !why.empty()) return fail(why);
  res.detail = describe(whole, c.check) + (lowest == DType::f32 ? "" : std::string(" (") + dtype_name(lowest) + ")");
  return res;
}

}  // namespace kiln::conformance
