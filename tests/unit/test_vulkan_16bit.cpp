// 16-bit storage on the Vulkan backend: the cast kernel against kiln/half.hpp bit for bit, and ops whose kernels read
// float32 only (run on float32 copies the dispatch converts) or read 16-bit storage themselves, on bfloat16 and
// float16 buffers against kiln::reference_op on the rounded inputs. Skipped where there is no Vulkan device or it
// lacks the 16-bit features (supports_dtype says no).
#include <atomic>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/error.hpp"
#include "kiln/half.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

struct Vk {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
  std::unique_ptr<Allocator> alloc;
  std::string why_not;  // empty when the device opened
  uint64_t validation_messages() {
    return static_cast<std::atomic<uint64_t>*>(device->extension(kValidationMessagesExtension))->load();
  }
};

// The first Vulkan device, validation on; why_not says why there is none.
Vk open_vulkan() {
  Vk v;
  if (!test::registry().has_backend("vulkan")) {
    v.why_not = "the vulkan backend is not built in this tree";
    return v;
  }
  v.backend = test::registry().backend("vulkan")(BackendOptions::parse("validation = true"));
  if (v.backend->enumerate().empty()) {
    v.why_not = "no Vulkan device: " + v.backend->unavailable_reason();
    return v;
  }
  v.device = v.backend->open(0);
  v.alloc = std::make_unique<Allocator>(*v.device, AllocatorOptions{});
  for (DType t : {DType::bf16, DType::f16})
    if (Support s = v.device->supports_dtype(t); !s.yes) v.why_not = s.reason;
  return v;
}

// Values of type t stored as the device holds them (storage_bytes: 16-bit tensors end on a whole word).
std::vector<char> encode(const std::vector<float>& x, DType t) {
  std::vector<char> b(storage_bytes(static_cast<int64_t>(x.size()), t), 0);
  if (t == DType::f32)
    std::memcpy(b.data(), x.data(), x.size() * 4);
  else
    from_float(x.data(), b.data(), t, x.size());
  return b;
}
std::vector<float> decode(const std::vector<char>& b, DType t, size_t n) {
  std::vector<float> x(n);
  if (t == DType::f32)
    std::memcpy(x.data(), b.data(), n * 4);
  else
    to_float(b.data(), t, x.data(), n);
  return x;
}

struct Tensor {
  std::vector<float> values;
  DType t = DType::f32;
};

// Runs the op on the device with each buffer of its type (an output listed in `alias` as {out, in} is that input's
// buffer), in a workspace of workspace_bytes; the outputs as float32. Outputs start as `init` (rounded to their
// type) where given, else as garbage the kernel must overwrite.
using OutStart = std::vector<std::vector<float>>;
std::vector<std::vector<float>> run_typed(Vk& v, OpKind kind, const OpAttrs& a, const std::vector<Tensor>& in,
                                          const std::vector<DType>& out_t, std::pair<int, int> alias = {-1, -1},
                                          const OutStart& init = {}) {
  const OpArity ar = op_arity(kind, a);
  REQUIRE(ar.in.size() == in.size());
  REQUIRE(ar.out.size() == out_t.size());
  std::vector<Allocation> keep;
  OpCall c{kind, a, {}, {}, {}};
  for (const auto& x : in) {
    const std::vector<char> b = encode(x.values, x.t);
    keep.push_back(v.alloc->allocate(b.size(), {}));
    BufferView view = keep.back().view();
    view.bytes = b.size();
    view.dtype = x.t;
    v.device->copy_from_host(b.data(), view);
    c.in.push_back(view);
  }
  for (size_t o = 0; o < out_t.size(); ++o) {
    if (static_cast<int>(o) == alias.first) {
      c.out.push_back(c.in[static_cast<size_t>(alias.second)]);
      continue;
    }
    const size_t bytes = storage_bytes(ar.out[o], out_t[o]);
    keep.push_back(v.alloc->allocate(bytes, {}));
    BufferView view = keep.back().view();
    view.bytes = bytes;
    view.dtype = out_t[o];
    std::vector<char> start(bytes, static_cast<char>(0x7b));  // garbage (about 1.3e36 as float32 or bfloat16)
    if (o < init.size()) start = encode(init[o], out_t[o]);
    v.device->copy_from_host(start.data(), view);
    c.out.push_back(view);
  }
  check_call(c, "test");
  if (const size_t ws = v.device->workspace_bytes(c)) {
    keep.push_back(v.alloc->allocate(ws, {}));
    c.workspace = keep.back().view();
    c.workspace.bytes = ws;
  }
  v.device->run(c);
  std::vector<std::vector<float>> outs;
  for (size_t o = 0; o < c.out.size(); ++o) {
    std::vector<char> b(c.out[o].bytes);
    v.device->copy_to_host(c.out[o], b.data());
    outs.push_back(decode(b, c.out[o].dtype, static_cast<size_t>(ar.out[o])));
  }
  return outs;
}

// reference_op on the inputs rounded to their types, each output rounded to its type.
std::vector<std::vector<float>> reference_typed(OpKind kind, const OpAttrs& a, const std::vector<Tensor>& in,
                                                const std::vector<DType>& out_t, const OutStart& init = {}) {
  const OpArity ar = op_arity(kind, a);
  std::vector<std::vector<float>> rin, rout;
  for (const auto& x : in) {
    rin.push_back(x.values);
    for (float& f : rin.back()) f = round_to(f, x.t);
  }
  for (size_t o = 0; o < ar.out.size(); ++o) {
    rout.emplace_back(static_cast<size_t>(ar.out[o]));
    if (o < init.size())
      for (size_t i = 0; i < rout[o].size(); ++i) rout[o][i] = round_to(init[o][i], out_t[o]);
  }
  std::vector<const float*> ip;
  std::vector<float*> op;
  for (auto& x : rin) ip.push_back(x.data());
  for (auto& y : rout) op.push_back(y.data());
  reference_op(kind, a, ip, op);
  for (size_t o = 0; o < rout.size(); ++o)
    for (float& f : rout[o]) f = round_to(f, out_t[o]);
  return rout;
}

// One ulp of type t at |want| (2^-7 of it for bfloat16's 8-bit significand, 2^-10 for float16, 2^-23 for float32),
// plus `abs`: the device sums in another order than the reference, so a result may round to the neighbour.
void check_close(const std::vector<float>& got, const std::vector<float>& want, DType t, float abs,
                 const std::string& what) {
  REQUIRE(got.size() == want.size());
  const float rel = t == DType::bf16 ? 0x1p-7f : t == DType::f16 ? 0x1p-10f : 0x1p-23f;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs)) {
      if (bad++ < 4) UNSCOPED_INFO(what << "[" << i << "]: got " << got[i] << ", expected " << want[i]);
    }
  CHECK(bad == 0);
}

std::vector<float> pattern(size_t n, float lo, float hi, uint32_t seed) {
  std::vector<float> x(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& f : x) {
    s = s * 1664525u + 1013904223u;
    f = lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.f;
  }
  return x;
}

const char* name(DType t) { return dtype_name(t); }

}  // namespace

TEST_CASE("vulkan cast rounds to nearest even exactly as kiln/half.hpp does, NaN kept", "[vulkan16]") {
  Vk v = open_vulkan();
  if (!v.device || !v.why_not.empty()) KILN_SKIP(v.why_not);
  // Ties, subnormals of both types, overflow to infinity, infinities, NaNs, signed zeros, and random values.
  std::vector<float> x = {0.f,
                          -0.f,
                          1.f,
                          -1.5f,
                          1.f + 0x1p-8f,
                          1.f + 3 * 0x1p-8f,
                          1.f + 0x1p-11f,
                          1.f + 3 * 0x1p-11f,
                          65504.f,
                          65519.f,
                          65520.f,
                          -1e6f,
                          3e38f,
                          0x1p-24f,
                          0x1p-25f,
                          3 * 0x1p-26f,
                          0x1p-14f,
                          0x1.ffcp-15f,
                          1e-30f,
                          -1e-40f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7f800001u)};
  for (float f : pattern(4075, -300.f, 300.f, 1)) x.push_back(f);
  for (float f : pattern(1000, -1e-4f, 1e-4f, 2)) x.push_back(f);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  for (const size_t n : {size_t{7}, x.size()})
    for (DType from : types)
      for (DType to : types) {
        if (from == to) continue;
        std::vector<float> in(x.begin(), x.begin() + static_cast<long>(n));
        for (float& f : in) f = round_to(f, from);  // what a `from` buffer can hold
        // Between sentinel words in one block: a kernel writing pairs of 16-bit values must stay inside.
        const std::vector<char> src = encode(in, from);
        const size_t dst_bytes = storage_bytes(static_cast<int64_t>(n), to);
        Allocation blk = v.alloc->allocate(src.size() + dst_bytes + 8, {});
        BufferView s = blk.view(), d = blk.view(), all = blk.view();
        s.bytes = src.size();
        s.dtype = from;
        d.offset += src.size() + 4;
        d.bytes = dst_bytes;
        d.dtype = to;
        all.bytes = src.size() + dst_bytes + 8;
        std::vector<char> init(all.bytes, static_cast<char>(0x5a));
        std::memcpy(init.data(), src.data(), src.size());
        v.device->copy_from_host(init.data(), all);
        OpCall c{OpKind::Cast, CastAttrs{static_cast<int64_t>(n), from, to}, {s}, {d}, {}};
        check_call(c, "test");
        v.device->run(c);
        std::vector<char> back(all.bytes);
        v.device->copy_to_host(all, back.data());
        INFO(name(from) << " to " << name(to) << ", " << n << " values");
        const std::vector<char> want = encode(in, to);  // encode rounds as kiln/half.hpp does
        CHECK(std::memcmp(back.data() + d.offset - all.offset, want.data(), want.size()) == 0);
        for (size_t i = 0; i < 4; ++i) {
          CHECK(back[src.size() + i] == 0x5a);
          CHECK(back[all.bytes - 1 - i] == 0x5a);
        }
      }
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan gemm, add, axpby, relu, gelu, softmax and layer_norm on bfloat16 and float16 buffers", "[vulkan16]") {
  Vk v = open_vulkan();
  if (!v.device || !v.why_not.empty()) KILN_SKIP(v.why_not);
  for (DType t : {DType::bf16, DType::f16}) {
    INFO("type " << name(t));
    {  // both operands and y 16-bit, as a 16-bit layer's gemm; shapes that do and do not allow vec4 loads
      for (auto [m, n, k, ta, tb] : {std::tuple{5, 7, 9, false, false}, std::tuple{16, 32, 64, false, true},
                                     std::tuple{12, 8, 20, true, false}}) {
        GemmAttrs a;
        a.m = m, a.n = n, a.k = k, a.trans_a = ta, a.trans_b = tb;
        const std::vector<Tensor> in = {{pattern(size_t(m * k), -2.f, 2.f, 3), t},
                                        {pattern(size_t(k * n), -2.f, 2.f, 4), t}};
        const auto got = run_typed(v, OpKind::Gemm, a, in, {t});
        // |y| up to ~k*4; sums of k products in another order: a few float32 ulps before rounding to t.
        check_close(got[0], reference_typed(OpKind::Gemm, a, in, {t})[0], t, 1e-3f,
                    "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
      }
      {  // y read (beta != 0) and written in t; float16 runs the native kernel on llvmpipe here (K, N multiples of 4)
        GemmAttrs a;
        a.m = 8, a.n = 12, a.k = 16, a.beta = 0.5f;
        const std::vector<Tensor> in = {{pattern(128, -1.f, 1.f, 17), t}, {pattern(192, -1.f, 1.f, 18), t}};
        const OutStart y_start = {pattern(96, -1.f, 1.f, 19)};
        check_close(run_typed(v, OpKind::Gemm, a, in, {t}, {-1, -1}, y_start)[0],
                    reference_typed(OpKind::Gemm, a, in, {t}, y_start)[0], t, 1e-3f, "gemm beta = 0.5");
        GemmAttrs b;  // attention's products: 3 batches, B transposed
        b.m = 8, b.n = 16, b.k = 12, b.batch = 3, b.trans_b = true;
        const std::vector<Tensor> bin = {{pattern(3 * 96, -1.f, 1.f, 20), t}, {pattern(3 * 192, -1.f, 1.f, 21), t}};
        check_close(run_typed(v, OpKind::BatchedGemm, b, bin, {t})[0],
                    reference_typed(OpKind::BatchedGemm, b, bin, {t})[0], t, 1e-3f, "batched_gemm");
      }
      // Mixed: a float32 layer after 16-bit ones (x 16-bit, W and y float32), accumulating into y (beta = 1).
      GemmAttrs a;
      a.m = 6, a.n = 10, a.k = 12, a.beta = 1.f;
      const std::vector<Tensor> in = {{pattern(72, -1.f, 1.f, 5), t}, {pattern(120, -1.f, 1.f, 6), DType::f32}};
      const OutStart y_start = {pattern(60, -1.f, 1.f, 16)};
      check_close(run_typed(v, OpKind::Gemm, a, in, {DType::f32}, {-1, -1}, y_start)[0],
                  reference_typed(OpKind::Gemm, a, in, {DType::f32}, y_start)[0], DType::f32, 1e-5f,
                  "gemm mixed, beta = 1");
    }
    {
      const std::vector<Tensor> in = {{pattern(1001, -3.f, 3.f, 7), t}, {pattern(1001, -3.f, 3.f, 8), t}};
      const ElementwiseAttrs a{1001, 1.f, 1.f};
      check_close(run_typed(v, OpKind::Add, a, in, {t})[0], reference_typed(OpKind::Add, a, in, {t})[0], t, 0.f, "add");
      // axpby reads its output: y = 0.5 x + 2 y with x float32 and y 16-bit.
      const std::vector<Tensor> x = {{pattern(333, -3.f, 3.f, 9), DType::f32}};
      const ElementwiseAttrs b{333, 0.5f, 2.f};
      const OutStart y_start = {pattern(333, -1.f, 1.f, 10)};
      check_close(run_typed(v, OpKind::Axpby, b, x, {t}, {-1, -1}, y_start)[0],
                  reference_typed(OpKind::Axpby, b, x, {t}, y_start)[0], t, 0.f, "axpby");
    }
    for (Activation act : {Activation::relu, Activation::gelu}) {
      const ActivationAttrs a{act, 777};
      const std::vector<Tensor> in = {{pattern(777, -4.f, 4.f, 11), t}};
      const std::string what = act == Activation::relu ? "relu" : "gelu";
      check_close(run_typed(v, OpKind::ActivationForward, a, in, {t})[0],
                  reference_typed(OpKind::ActivationForward, a, in, {t})[0], t, 1e-6f, what);
      // In place (y is x's buffer): the one float32 copy is converted in, then back.
      check_close(run_typed(v, OpKind::ActivationForward, a, in, {t}, {0, 0})[0],
                  reference_typed(OpKind::ActivationForward, a, in, {t})[0], t, 1e-6f, what + " in place");
    }
    {
      const SoftmaxAttrs a{9, 37, false};
      const std::vector<Tensor> in = {{pattern(9 * 37, -5.f, 5.f, 12), t}};
      check_close(run_typed(v, OpKind::SoftmaxForward, a, in, {t})[0],
                  reference_typed(OpKind::SoftmaxForward, a, in, {t})[0], t, 1e-6f, "softmax");
    }
    {  // x and y 16-bit; gamma, beta (parameters) and the saved mean and rstd float32
      const LayerNormAttrs a{7, 48, 1e-5f, true};
      const std::vector<Tensor> in = {{pattern(7 * 48, -2.f, 3.f, 13), t},
                                      {pattern(48, 0.5f, 1.5f, 14), DType::f32},
                                      {pattern(48, -0.5f, 0.5f, 15), DType::f32}};
      const std::vector<DType> out = {t, DType::f32, DType::f32};
      const auto got = run_typed(v, OpKind::LayerNormForward, a, in, out);
      const auto want = reference_typed(OpKind::LayerNormForward, a, in, out);
      check_close(got[0], want[0], t, 1e-5f, "layer_norm y");
      check_close(got[1], want[1], DType::f32, 1e-5f, "layer_norm mean");
      check_close(got[2], want[2], DType::f32, 1e-3f, "layer_norm rstd");
    }
  }
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan 16-bit calls size their float32 copies in the workspace and refuse to run without it", "[vulkan16]") {
  Vk v = open_vulkan();
  if (!v.device || !v.why_not.empty()) KILN_SKIP(v.why_not);
  const ElementwiseAttrs a{1000, 1.f, 1.f};
  // The planner's call: unbound views with their bytes and types.
  OpCall planned{OpKind::Add,
                 a,
                 {BufferView{nullptr, 0, 2000, DType::bf16}, BufferView{nullptr, 0, 4000}},
                 {BufferView{nullptr, 0, 2000, DType::bf16}},
                 {}};
  CHECK(v.device->workspace_bytes(planned) >= 2 * 4000);  // two float32 copies of 1000 values
  planned.in[0].dtype = planned.out[0].dtype = DType::f32;
  planned.in[0].bytes = planned.out[0].bytes = 4000;
  CHECK(v.device->workspace_bytes(planned) == 0);
  // A cast reads 16-bit storage itself: no copies.
  CHECK(v.device->workspace_bytes(OpCall{OpKind::Cast,
                                         CastAttrs{1000, DType::f32, DType::f16},
                                         {BufferView{nullptr, 0, 4000}},
                                         {BufferView{nullptr, 0, 2000, DType::f16}},
                                         {}}) == 0);
  // On llvmpipe gemm reads float16 operands itself (gemm_lvp_h_*.comp): no copies; bfloat16 ones are copied.
  if (v.device->info().name.find("llvmpipe") != std::string::npos && !std::getenv("KILN_VULKAN_LVP_GEMM")) {
    for (DType t : {DType::f16, DType::bf16}) {
      OpCall g{OpKind::Gemm,
               GemmAttrs{16, 32, 64},
               {BufferView{nullptr, 0, 2048, t}, BufferView{nullptr, 0, 4096, t}},
               {BufferView{nullptr, 0, 1024, t}},
               {}};
      INFO(dtype_name(t));
      CHECK((v.device->workspace_bytes(g) == 0) == (t == DType::f16));
    }
  }
  Allocation x = v.alloc->allocate(2000, {}), y = v.alloc->allocate(4000, {}), z = v.alloc->allocate(2000, {});
  BufferView xv = x.view(), yv = y.view(), zv = z.view();
  xv.bytes = zv.bytes = 2000, yv.bytes = 4000;
  xv.dtype = zv.dtype = DType::bf16;
  OpCall c{OpKind::Add, a, {xv, yv}, {zv}, {}};
  check_call(c, "test");
  CHECK_THROWS_WITH(v.device->run(c), Catch::Contains("float32 copies in the workspace") &&
                                          Catch::Contains("the call's workspace holds 0"));
}

TEST_CASE("vulkan refuses 16-bit storage on a device without the features, naming them", "[vulkan16]") {
  ::setenv("KILN_VULKAN_16BIT", "0", 1);
  Vk v = open_vulkan();
  ::unsetenv("KILN_VULKAN_16BIT");
  if (!v.device) KILN_SKIP(v.why_not);
  CHECK(v.device->supports_dtype(DType::f32).yes);
  const Support h = v.device->supports_dtype(DType::f16), b = v.device->supports_dtype(DType::bf16);
  CHECK_FALSE(h.yes);
  CHECK_FALSE(b.yes);
  const std::string dev = v.device->info().name;
  CHECK_THAT(h.reason, Catch::Contains("VkPhysicalDeviceShaderFloat16Int8Features::shaderFloat16") &&
                           Catch::Contains("VkPhysicalDevice16BitStorageFeatures::storageBuffer16BitAccess") &&
                           Catch::Contains(dev) && Catch::Contains("float16"));
  CHECK_THAT(b.reason, Catch::Contains("VkPhysicalDevice16BitStorageFeatures::storageBuffer16BitAccess") &&
                           !Catch::Contains("shaderFloat16") && Catch::Contains("bfloat16"));
}
