// The CUDA backend on 16-bit storage (bfloat16, float16): the cast kernel, cuBLAS GEMM on 16-bit operands, and the
// float32 conversion the device puts around kernels that read float32 only. Each is compared with the reference
// run in float32 on the rounded inputs, its result rounded to the output's type. Without a CUDA device the tests
// that need one are skipped with the reason (KILN_SKIP, reported to CTest as Skipped).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "kiln/half.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "test_cuda_support.hpp"

using namespace kiln;
namespace kc = kiln::test::cuda;

namespace {

// A device buffer of n values stored as `t` (storage_bytes: 16-bit ones rounded up to 4 bytes); frees itself.
class TypedBuffer {
 public:
  TypedBuffer(Device& d, int64_t n, DType t) : n_(n), t_(t), buf_(d, storage_bytes(n, t)), d_(d) {}
  TypedBuffer(Device& d, const std::vector<float>& v, DType t) : TypedBuffer(d, static_cast<int64_t>(v.size()), t) {
    upload(v);
  }
  BufferView view() const {
    BufferView v = buf_.view();
    v.dtype = t_;
    return v;
  }
  // Host floats to storage of type t (rounded to nearest even), copied to the device.
  void upload(const std::vector<float>& v) {
    std::vector<unsigned char> bytes(storage_bytes(n_, t_));
    if (t_ == DType::f32)
      std::memcpy(bytes.data(), v.data(), v.size() * sizeof(float));
    else
      from_float(v.data(), bytes.data(), t_, v.size());
    if (!bytes.empty()) d_.copy_from_host(bytes.data(), buf_.view());
  }
  // The device's values as float32 (exact: every 16-bit value is a float32).
  std::vector<float> download() const {
    std::vector<unsigned char> bytes(storage_bytes(n_, t_));
    if (!bytes.empty()) d_.copy_to_host(buf_.view(), bytes.data());
    std::vector<float> v(static_cast<size_t>(n_));
    if (t_ == DType::f32)
      std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    else
      to_float(bytes.data(), t_, v.data(), v.size());
    return v;
  }

 private:
  int64_t n_;
  DType t_;
  kc::DeviceBuffer buf_;
  Device& d_;
};

std::vector<float> random_values(int64_t n, std::mt19937& g, DType round, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = round_to(u(g), round);
  return v;
}

// Runs the call on the device with inputs/outputs of the given types (outputs start from `out`, read-write ops
// read them) and returns the outputs as float32.
std::vector<std::vector<float>> run_typed(Device& d, OpKind kind, const OpAttrs& attrs,
                                          const std::vector<std::vector<float>>& in, const std::vector<DType>& in_t,
                                          const std::vector<std::vector<float>>& out, const std::vector<DType>& out_t,
                                          size_t* workspace = nullptr) {
  std::vector<std::unique_ptr<TypedBuffer>> din, dout;
  OpCall call{kind, attrs, {}, {}, {}};
  for (size_t i = 0; i < in.size(); ++i) {
    din.push_back(std::make_unique<TypedBuffer>(d, in[i], in_t[i]));
    call.in.push_back(din.back()->view());
  }
  for (size_t i = 0; i < out.size(); ++i) {
    dout.push_back(std::make_unique<TypedBuffer>(d, out[i], out_t[i]));
    call.out.push_back(dout.back()->view());
  }
  const size_t ws_bytes = d.workspace_bytes(call);
  if (workspace) *workspace = ws_bytes;
  kc::DeviceBuffer ws(d, ws_bytes);
  call.workspace = ws.view();
  d.run(call);
  d.synchronize();
  std::vector<std::vector<float>> got;
  for (auto& b : dout) got.push_back(b->download());
  return got;
}

// The reference in float32 on the same (already rounded) values, each output rounded to its type.
std::vector<std::vector<float>> reference_typed(OpKind kind, const OpAttrs& attrs,
                                                const std::vector<std::vector<float>>& in,
                                                std::vector<std::vector<float>> out, const std::vector<DType>& out_t) {
  std::vector<const float*> rin;
  std::vector<float*> rout;
  for (auto& v : in) rin.push_back(v.data());
  for (auto& v : out) rout.push_back(v.data());
  reference_op(kind, attrs, rin, rout);
  for (size_t o = 0; o < out.size(); ++o)
    for (auto& x : out[o]) x = round_to(x, out_t[o]);
  return out;
}

// One unit in the last place of t, relative: results that round from float32 sums added in another order may
// land one step apart.
double rel_ulp(DType t) { return t == DType::bf16 ? 1.0 / 128 : t == DType::f16 ? 1.0 / 1024 : 1e-5; }

// "" when every element is within one unit of the output type (plus atol), else the first that is not.
std::string compare(const std::vector<float>& got, const std::vector<float>& want, DType t, double atol,
                    const std::string& label) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i], b = want[i];
    if (std::fabs(a - b) <= atol + rel_ulp(t) * std::fabs(b)) continue;
    std::ostringstream m;
    m.precision(9);
    m << label << " element " << i << ": cuda " << a << ", reference " << b << " (" << dtype_name(t) << " output)";
    return m.str();
  }
  return {};
}

// The 16-bit types this device runs; skips the types it refuses, saying why.
std::vector<DType> types_of(const Device& d, std::string& refused) {
  std::vector<DType> r;
  for (DType t : {DType::bf16, DType::f16}) {
    const Support s = d.supports_dtype(t);
    if (s.yes)
      r.push_back(t);
    else
      refused += std::string(dtype_name(t)) + ": " + s.reason + "\n";
  }
  return r;
}

}  // namespace

TEST_CASE("cuda registers a cast kernel and gemm kernels for 16-bit storage", "[cuda][cuda16]") {
  std::string why;
  auto b = kc::backend_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(b, why);
  (void)b->enumerate();  // loads the runtime library, which registers the built-in kernels, GPU or not
  if (!find_kernel("cuda", OpKind::Gemm))
    KILN_SKIP("the cuda runtime library did not load: " << b->unavailable_reason());
  CHECK(find_kernel("cuda", OpKind::Cast) != nullptr);
}

TEST_CASE("cuda device says which 16-bit types its compute capability runs", "[cuda][cuda16]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  CHECK(d->supports_dtype(DType::f32).yes);
  // The name carries "(sm_XY, ...)" (describe_device).
  const std::string name = d->info().name;
  const auto sm = name.find("(sm_");
  REQUIRE(sm != std::string::npos);
  const int major = std::stoi(name.substr(sm + 4, name.size() - sm - 5)) / 10;
  const Support bf = d->supports_dtype(DType::bf16), h = d->supports_dtype(DType::f16);
  CHECK(bf.yes == (major >= 8));
  CHECK(h.yes == (major >= 7));
  if (!bf.yes) CHECK_THAT(bf.reason, Catch::Contains("compute capability") && Catch::Contains("bfloat16"));
}

TEST_CASE("cuda cast rounds float32 bfloat16 and float16 to nearest even like the host", "[cuda][cuda16]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  std::string refused;
  std::vector<DType> types = types_of(*d, refused);
  if (types.empty()) KILN_SKIP(refused);
  types.push_back(DType::f32);
  // Ties, subnormals of both 16-bit types, float16 overflow, signed zero, infinities and NaN, then random values.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> src = {0.f,     -0.f,    1.f,      -1.f,          1.00390625f, 1.01171875f, 65504.f,
                            65519.f, 65520.f, -70000.f, 1e-8f,         3e-5f,       6e-8f,       1e-40f,
                            -1e-39f, inf,     -inf,     std::nanf(""), 3.1415926f,  1e30f,       -2.5e-3f};
  std::mt19937 g(11);
  for (float x : random_values(1000, g, DType::f32, -300.f, 300.f)) src.push_back(x);
  const auto n = static_cast<int64_t>(src.size());  // odd: the last 16-bit word of the buffer is padding
  for (DType from : types)
    for (DType to : types) {
      if (from == to) continue;
      INFO(dtype_name(from) << " to " << dtype_name(to));
      std::vector<float> in = src;
      for (auto& x : in) x = round_to(x, from);  // what a `from` buffer can hold
      const auto got =
          run_typed(*d, OpKind::Cast, CastAttrs{n, from, to}, {in}, {from}, {std::vector<float>(src.size())}, {to})[0];
      for (size_t i = 0; i < in.size(); ++i) {
        const float want = round_to(in[i], to);
        if (std::isnan(want)) {
          CHECK(std::isnan(got[i]));
        } else if (std::memcmp(&got[i], &want, sizeof want) != 0) {
          FAIL_CHECK("element " << i << " (" << in[i] << "): cuda " << got[i] << ", host " << want);
        }
      }
    }
}

TEST_CASE("cuda gemm and batched gemm on bfloat16 and float16 operands match the reference", "[cuda][cuda16]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  std::string refused;
  const std::vector<DType> types = types_of(*d, refused);
  if (types.empty()) KILN_SKIP(refused);
  std::mt19937 g(3);
  for (DType t : types)
    for (DType yt : {t, DType::f32})
      for (int v = 0; v < 4; ++v) {
        GemmAttrs a{37, 29, 70, (v & 1) != 0, (v & 2) != 0, 1.f, v == 3 ? 0.5f : 0.f, 1};
        const OpKind kind = v == 2 ? OpKind::BatchedGemm : OpKind::Gemm;
        if (kind == OpKind::BatchedGemm) a.batch = 3;
        const std::string label = std::string(op_name(kind)) + " " + dtype_name(t) + " -> " + dtype_name(yt) +
                                  " trans_a=" + std::to_string(a.trans_a) + " trans_b=" + std::to_string(a.trans_b) +
                                  " beta=" + std::to_string(a.beta);
        INFO(label);
        const OpArity ar = op_arity(kind, a);
        const std::vector<std::vector<float>> in = {random_values(ar.in[0], g, t), random_values(ar.in[1], g, t)};
        const std::vector<std::vector<float>> out = {random_values(ar.out[0], g, yt)};
        size_t ws16 = 0;
        const auto got = run_typed(*d, kind, a, in, {t, t}, out, {yt}, &ws16);
        const auto want = reference_typed(kind, a, in, out, {yt});
        CHECK(compare(got[0], want[0], yt, 1e-5 * a.k, label) == "");
        // Native: cuBLAS reads the 16-bit operands, so the workspace holds no float32 copies of them.
        OpCall f32{kind, a, {BufferView{}, BufferView{}}, {BufferView{}}, {}};
        f32.in[0].bytes = storage_bytes(ar.in[0], DType::f32);
        f32.in[1].bytes = storage_bytes(ar.in[1], DType::f32);
        f32.out[0].bytes = storage_bytes(ar.out[0], DType::f32);
        CHECK(ws16 == d->workspace_bytes(f32));
      }
}

TEST_CASE("cuda runs float32-only kernels on 16-bit buffers through float32 copies", "[cuda][cuda16]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  std::string refused;
  const std::vector<DType> types = types_of(*d, refused);
  if (types.empty()) KILN_SKIP(refused);
  std::mt19937 g(8);
  for (DType t : types) {
    INFO(dtype_name(t));
    // Add has no 16-bit kernel: a and b 16-bit, y 16-bit; odd count (padding word).
    const ElementwiseAttrs add{1001, 0.75f, -1.5f};
    const std::vector<std::vector<float>> in = {random_values(1001, g, t), random_values(1001, g, t)};
    const std::vector<std::vector<float>> out = {std::vector<float>(1001, 0.f)};
    size_t ws = 0;
    auto got = run_typed(*d, OpKind::Add, add, in, {t, t}, out, {t}, &ws);
    CHECK(ws >= 3 * 1002 * sizeof(float));  // three float32 copies
    CHECK(compare(got[0], reference_typed(OpKind::Add, add, in, out, {t})[0], t, 1e-6, "add") == "");
    // A gemm with a float32 weight (a layer kept in float32 after 16-bit ones): converted, not native.
    const GemmAttrs mm{16, 24, 40, false, true, 1.f, 0.f, 1};
    const OpArity ar = op_arity(OpKind::Gemm, mm);
    const std::vector<std::vector<float>> gin = {random_values(ar.in[0], g, t), random_values(ar.in[1], g, DType::f32)};
    const std::vector<std::vector<float>> gout = {std::vector<float>(static_cast<size_t>(ar.out[0]), 0.f)};
    got = run_typed(*d, OpKind::Gemm, mm, gin, {t, DType::f32}, gout, {t});
    CHECK(compare(got[0], reference_typed(OpKind::Gemm, mm, gin, gout, {t})[0], t, 1e-5 * mm.k, "mixed gemm") == "");
  }
}

TEST_CASE("cuda convolutions on bfloat16 and float16 buffers match the reference", "[cuda][cuda16]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  std::string refused;
  const std::vector<DType> types = types_of(*d, refused);
  if (types.empty()) KILN_SKIP(refused);
  std::mt19937 g(21);
  // Symmetric padding (cuDNN pads), and an asymmetric shape that runs on an explicitly padded copy.
  const ConvAttrs shapes[] = {{2, 8, 12, 12, 16, 3, 3, 1, 1, 1, 1, 12, 12}, {2, 3, 9, 9, 5, 2, 2, 1, 1, 0, 0, 9, 9}};
  for (DType t : types)
    for (const ConvAttrs& a : shapes)
      for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
        const std::string label = std::string(op_name(kind)) + " " + dtype_name(t) + " c=" + std::to_string(a.c);
        INFO(label);
        const OpArity ar = op_arity(kind, a);
        const std::vector<std::vector<float>> in = {random_values(ar.in[0], g, t), random_values(ar.in[1], g, t)};
        const std::vector<std::vector<float>> out = {std::vector<float>(static_cast<size_t>(ar.out[0]), 0.f)};
        const auto got = run_typed(*d, kind, a, in, {t, t}, out, {t});
        const auto want = reference_typed(kind, a, in, out, {t});
        // Sums of up to n*oh*ow (filter gradient) products in float32, rounded once to t.
        CHECK(compare(got[0], want[0], t, 1e-5 * static_cast<double>(a.n * a.oh * a.ow), label) == "");
      }
  const std::string report = static_cast<const char*>(d->extension("cuda.conv_report"));
  INFO(report);
  CHECK_THAT(report, Catch::Contains(dtype_name(types[0])));
}
