// The CPU kernels that read and write bf16 storage themselves (float32 arithmetic inside): each op, on buffers of
// the types a bf16 layer gives it, against kiln::reference_op on the same values rounded to bf16. A kernel that read
// bf16 bytes as float32 (or wrote float32 into a bf16 buffer) gives garbage and fails the comparison; the workspace
// check says the backend did not convert the call to float32 around a float32-only kernel instead.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/device.hpp"
#include "kiln/half.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;
using Vec = std::vector<float>;

namespace {

struct Opened {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
};

Opened open_cpu(int threads) {
  Opened r;
  r.backend = test::registry().backend("cpu")(BackendOptions::parse("threads = " + std::to_string(threads)));
  r.device = r.backend->open(0);
  return r;
}

// How an input's values are drawn.
enum class Fill { uniform, labels, ids, positive };

struct Case {
  OpKind kind;
  OpAttrs attrs;
  std::vector<DType> in, out;
  std::vector<Fill> fill;  // per input; missing: uniform in [-2, 2]
  bool scratch = false;    // the native kernel itself needs a workspace (oneDNN's matmul scratchpad)
  std::string name;
};

Vec draw(int64_t n, Fill f, int64_t classes, std::mt19937& g) {
  Vec v(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-2.f, 2.f), p(0.5f, 1.5f);
  std::uniform_int_distribution<int64_t> c(0, std::max<int64_t>(classes - 1, 0));
  for (auto& x : v) {
    switch (f) {
      case Fill::uniform:
        x = u(g);
        break;
      case Fill::positive:
        x = p(g);
        break;
      case Fill::labels:
      case Fill::ids:
        x = static_cast<float>(c(g));
        break;
    }
  }
  return v;
}

// Bytes of v stored as t (bf16 rounds to nearest even).
std::vector<char> store(const Vec& v, DType t) {
  std::vector<char> b(storage_bytes(static_cast<int64_t>(v.size()), t));
  if (t == DType::f32)
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  else
    from_float(v.data(), b.data(), t, v.size());
  return b;
}
Vec load(const std::vector<char>& b, DType t, size_t n) {
  Vec v(n);
  if (t == DType::f32)
    std::memcpy(v.data(), b.data(), n * sizeof(float));
  else
    to_float(b.data(), t, v.data(), n);
  return v;
}

// Runs the case on the device and the reference and checks every output.
void run_case(Device& d, const Case& k, std::mt19937& g) {
  INFO("op " << k.name);
  const OpArity ar = op_arity(k.kind, k.attrs);
  REQUIRE(ar.in.size() == k.in.size());
  REQUIRE(ar.out.size() == k.out.size());
  int64_t classes = 0;
  if (const auto* l = std::get_if<LossAttrs>(&k.attrs)) classes = l->cols;
  if (const auto* e = std::get_if<EmbeddingAttrs>(&k.attrs)) classes = e->vocab;

  std::vector<Vec> ins;
  for (size_t i = 0; i < ar.in.size(); ++i) {
    Vec v = draw(ar.in[i], i < k.fill.size() ? k.fill[i] : Fill::uniform, classes, g);
    for (auto& x : v) x = round_to(x, k.in[i]);  // the values the device holds
    ins.push_back(std::move(v));
  }
  // Reference on the rounded values, in float32.
  std::vector<Vec> ref;
  for (int64_t n : ar.out) ref.emplace_back(static_cast<size_t>(n), 0.f);
  std::vector<const float*> rin;
  std::vector<float*> rout;
  for (auto& v : ins) rin.push_back(v.data());
  for (auto& v : ref) rout.push_back(v.data());
  reference_op(k.kind, k.attrs, rin, rout);

  // Device: one block per buffer, holding the type's bytes.
  std::vector<Block*> blocks;
  OpCall call{k.kind, k.attrs, {}, {}, {}};
  auto bind = [&](int64_t n, DType t) {
    const size_t bytes = storage_bytes(n, t);
    Block* b = d.allocate_block(std::max<size_t>(bytes, 4));
    REQUIRE(b != nullptr);
    blocks.push_back(b);
    return BufferView{b, 0, bytes, t};
  };
  for (size_t i = 0; i < ins.size(); ++i) {
    call.in.push_back(bind(ar.in[i], k.in[i]));
    const auto bytes = store(ins[i], k.in[i]);
    d.copy_from_host(bytes.data(), call.in.back());
  }
  for (size_t i = 0; i < ar.out.size(); ++i) {
    call.out.push_back(bind(ar.out[i], k.out[i]));
    const Vec zeros(static_cast<size_t>(ar.out[i]), 0.f);
    const auto bytes = store(zeros, k.out[i]);
    d.copy_from_host(bytes.data(), call.out.back());
  }
  const size_t ws = d.workspace_bytes(call);
  // A converted call needs room for float32 copies of its bf16 buffers; a native one none (or its scratchpad).
  if (!k.scratch) CHECK(ws == 0);
  if (ws > 0) {
    Block* b = d.allocate_block(ws);
    blocks.push_back(b);
    call.workspace = BufferView{b, 0, ws};
  }
  d.run(call);

  for (size_t i = 0; i < ar.out.size(); ++i) {
    std::vector<char> bytes(call.out[i].bytes);
    d.copy_to_host(call.out[i], bytes.data());
    const Vec got = load(bytes, k.out[i], ref[i].size());
    float scale = 0.f;
    for (float r : ref[i]) scale = std::max(scale, std::fabs(r));
    // bf16 outputs: the float32 result rounded once (2^-9 relative) plus float32 differences in the order of
    // sums, measured against the output's magnitude (sums that cancel are exact only to that); float32 outputs:
    // float32 arithmetic on the same rounded inputs.
    const float rel = k.out[i] == DType::bf16 ? 1.0f / 128 : 1e-4f;
    const float abs = (k.out[i] == DType::bf16 ? 4e-3f : 1e-5f) * std::max(scale, 1e-3f);
    size_t bad = 0, first = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      const float r = ref[i][j], v = got[j];
      const bool ok = (std::isnan(r) && std::isnan(v)) || std::fabs(v - r) <= abs + rel * std::fabs(r);
      if (!ok && bad++ == 0) first = j;
    }
    INFO("output " << i << ": " << bad << " of " << got.size() << " values off; first at " << first << ": got "
                   << (bad ? got[first] : 0.f) << ", reference " << (bad ? ref[i][first] : 0.f));
    CHECK(bad == 0);
  }
  for (Block* b : blocks) d.free_block(b);
}

std::vector<Case> cases() {
  using D = DType;
  const D b = D::bf16, f = D::f32;
  std::vector<Case> c;
  const int64_t big = 40000 + 13;  // above kParallelMin (several threads) with a ragged tail
  for (Activation act : {Activation::relu, Activation::sigmoid, Activation::tanh, Activation::gelu,
                         Activation::gelu_tanh, Activation::silu}) {
    const std::string n = std::to_string(static_cast<int>(act));
    c.push_back({OpKind::ActivationForward, ActivationAttrs{act, big}, {b}, {b}, {}, false, "activation_forward " + n});
    c.push_back(
        {OpKind::ActivationBackward, ActivationAttrs{act, 1037}, {b, b}, {b}, {}, false, "activation_backward " + n});
  }
  c.push_back({OpKind::ActivationBackward,
               ActivationAttrs{Activation::gelu, 999},
               {b, f},
               {f},
               {},
               false,
               "activation_backward mixed"});
  c.push_back({OpKind::BiasAdd, BiasAttrs{300, 170, 1}, {b, f}, {b}, {}, false, "bias_add dense"});
  c.push_back({OpKind::BiasAdd, BiasAttrs{3, 7, 601}, {b, f}, {b}, {}, false, "bias_add planes"});
  c.push_back({OpKind::BiasGrad, BiasAttrs{300, 170, 1}, {b}, {f}, {}, false, "bias_grad dense f32"});
  c.push_back({OpKind::BiasGrad, BiasAttrs{300, 170, 1}, {b}, {b}, {}, false, "bias_grad dense bf16"});
  c.push_back({OpKind::BiasGrad, BiasAttrs{3, 7, 601}, {b}, {f}, {}, false, "bias_grad planes"});
  c.push_back({OpKind::Add, ElementwiseAttrs{big, 0.5f, -1.5f}, {b, b}, {b}, {}, false, "add"});
  c.push_back({OpKind::Add, ElementwiseAttrs{1001, 1.f, 1.f}, {b, f}, {f}, {}, false, "add mixed"});
  c.push_back({OpKind::Mul, ElementwiseAttrs{1001, 1.f, 1.f}, {f, b}, {b}, {}, false, "mul"});
  c.push_back({OpKind::Axpby, ElementwiseAttrs{1001, 2.f, 0.5f}, {b}, {b}, {}, false, "axpby"});
  c.push_back({OpKind::Scale, ElementwiseAttrs{1001, 3.f, 0.f}, {b}, {b}, {}, false, "scale"});
  c.push_back({OpKind::Fill, ElementwiseAttrs{1001, 1.25f, 0.f}, {}, {b}, {}, false, "fill"});
  c.push_back({OpKind::Copy, ElementwiseAttrs{1001, 1.f, 0.f}, {b}, {b}, {}, false, "copy"});
  c.push_back({OpKind::Copy, ElementwiseAttrs{1001, 1.f, 0.f}, {b}, {f}, {}, false, "copy to f32"});
  c.push_back({OpKind::Copy, ElementwiseAttrs{1001, 1.f, 0.f}, {f}, {b}, {}, false, "copy to bf16"});
  c.push_back({OpKind::SoftmaxForward, SoftmaxAttrs{200, 67, false}, {b}, {b}, {}, false, "softmax_forward"});
  c.push_back({OpKind::SoftmaxForward, SoftmaxAttrs{128, 64, true}, {b}, {b}, {}, false, "softmax_forward causal"});
  c.push_back({OpKind::SoftmaxBackward,
               SoftmaxAttrs{200, 67, false},
               {b, b},
               {b},
               {Fill::positive},
               false,
               "softmax_backward"});
  c.push_back({OpKind::SoftmaxCrossEntropy,
               LossAttrs{100, 65, 0.01f, true, false},
               {b, f},
               {f, b},
               {Fill::uniform, Fill::labels},
               false,
               "softmax_cross_entropy"});
  c.push_back({OpKind::LayerNormForward,
               LayerNormAttrs{300, 130, 1e-5f, true},
               {b, f, f},
               {b, f, f},
               {Fill::uniform, Fill::positive},
               false,
               "layer_norm_forward"});
  c.push_back({OpKind::LayerNormForward,
               LayerNormAttrs{300, 130, 1e-5f, false},
               {b, f},
               {b, f, f},
               {Fill::uniform, Fill::positive},
               false,
               "layer_norm_forward no bias"});
  c.push_back({OpKind::LayerNormBackward,
               LayerNormAttrs{300, 130, 1e-5f, true},
               {b, f, f, f, b},
               {b, f, f},
               {Fill::uniform, Fill::positive, Fill::uniform, Fill::positive},
               false,
               "layer_norm_backward"});
  c.push_back({OpKind::Concat, ConcatAttrs{5, 7, {3, 4, 1}}, {b, b, b}, {b}, {}, false, "concat"});
  c.push_back({OpKind::Split, ConcatAttrs{5, 7, {3, 4, 1}}, {b}, {b, b, b}, {}, false, "split"});
  PermuteAttrs pa;
  pa.rank = 4, pa.dims = {2, 5, 3, 8}, pa.perm = {0, 2, 1, 3};
  c.push_back({OpKind::Permute, pa, {b}, {b}, {}, false, "permute runs"});
  pa.perm = {3, 1, 0, 2};
  c.push_back({OpKind::Permute, pa, {b}, {b}, {}, false, "permute scattered"});
  c.push_back(
      {OpKind::EmbeddingForward, EmbeddingAttrs{50, 17, 40}, {f, f}, {b}, {Fill::ids}, false, "embedding_forward"});
  c.push_back(
      {OpKind::EmbeddingBackward, EmbeddingAttrs{50, 17, 40}, {f, b}, {f}, {Fill::ids}, false, "embedding_backward"});
  c.push_back({OpKind::DropoutForward, DropoutAttrs{1001, 0.3f, 7, 3}, {b}, {b}, {}, false, "dropout_forward"});
  c.push_back({OpKind::ReduceSum, ReduceAttrs{3, 50, 1}, {b}, {f}, {}, false, "reduce_sum rows"});
  c.push_back({OpKind::ReduceSum, ReduceAttrs{3, 50, 300}, {b}, {b}, {}, false, "reduce_sum planes"});
  c.push_back({OpKind::Cast, CastAttrs{big, D::f32, D::bf16}, {f}, {b}, {}, false, "cast to bf16"});
  c.push_back({OpKind::Cast, CastAttrs{big, D::bf16, D::f32}, {b}, {f}, {}, false, "cast from bf16"});
  GemmAttrs ga;
  ga.m = 96, ga.n = 80, ga.k = 72;
  c.push_back({OpKind::Gemm, ga, {b, b}, {b}, {}, true, "gemm"});
  ga.trans_a = true, ga.beta = 0.f;
  c.push_back({OpKind::Gemm, ga, {b, b}, {f}, {}, true, "gemm trans_a f32 out"});
  GemmAttrs gr = ga;  // A's transposed copy with ragged tiles: 93 columns, 37 rows
  gr.m = 93, gr.k = 37;
  c.push_back({OpKind::Gemm, gr, {b, b}, {b}, {}, true, "gemm trans_a ragged"});
  GemmAttrs bg;
  bg.m = 64, bg.n = 64, bg.k = 32, bg.batch = 12;
  c.push_back({OpKind::BatchedGemm, bg, {b, b}, {b}, {}, true, "batched_gemm"});
  bg.trans_b = true, bg.alpha = 0.25f;
  c.push_back({OpKind::BatchedGemm, bg, {b, b}, {b}, {}, true, "batched_gemm trans_b alpha"});
  bg.trans_b = false, bg.trans_a = true, bg.batch = 1, bg.alpha = 1.f;
  c.push_back({OpKind::BatchedGemm, bg, {b, b}, {f}, {}, true, "batched_gemm one matrix trans_a"});
  return c;
}

}  // namespace

TEST_CASE("cpu kernels read and write bf16 storage natively and match the reference", "[cpu][bf16]") {
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    auto cpu = open_cpu(threads);
    std::mt19937 g(11);
    for (const Case& k : cases()) {
      if (!cpu.device->supports(k.kind, k.attrs).yes) continue;
      run_case(*cpu.device, k, g);
    }
  }
}

TEST_CASE("cpu cast to bf16 rounds as kiln/half.hpp does, bit for bit", "[cpu][bf16]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  // Ties both ways, subnormals (which AVX512_BF16's conversion would flush to zero), infinities, NaNs, and
  // random values; 37 + 40000 of them so both the vector loop and the scalar tail run, on both threads.
  Vec v = {0.f,
           -0.f,
           1.f,
           1.00390625f,
           1.01171875f,
           1.0078125f,
           3.0e-39f,
           -1.5e-40f,
           1e-45f,
           3.4e38f,
           -3.4e38f,
           std::numeric_limits<float>::infinity(),
           -std::numeric_limits<float>::infinity(),
           std::numeric_limits<float>::quiet_NaN(),
           std::bit_cast<float>(0x7f800001u),
           std::bit_cast<float>(0xffc12345u)};
  std::mt19937 g(3);
  std::uniform_int_distribution<uint32_t> bits;
  while (v.size() < 40037) v.push_back(std::bit_cast<float>(bits(g)));
  const auto n = static_cast<int64_t>(v.size());
  Block* blk = d.allocate_block(storage_bytes(n, DType::f32) * 2);
  const BufferView x{blk, 0, storage_bytes(n, DType::f32), DType::f32};
  const BufferView y{blk, storage_bytes(n, DType::f32), storage_bytes(n, DType::bf16), DType::bf16};
  d.copy_from_host(v.data(), x);
  d.run(OpCall{OpKind::Cast, CastAttrs{n, DType::f32, DType::bf16}, {x}, {y}, {}});
  std::vector<uint16_t> got(static_cast<size_t>(n) + 1);
  d.copy_to_host(y, got.data());
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += got[i] != float_to_bf16(v[i]);
  CHECK(bad == 0);
  // And back: bf16 widens exactly.
  d.run(OpCall{OpKind::Cast, CastAttrs{n, DType::bf16, DType::f32}, {y}, {x}, {}});
  Vec back(v.size());
  d.copy_to_host(x, back.data());
  size_t bad_back = 0;
  for (size_t i = 0; i < v.size(); ++i)
    bad_back += std::bit_cast<uint32_t>(back[i]) != std::bit_cast<uint32_t>(bf16_to_float(got[i]));
  CHECK(bad_back == 0);
  d.free_block(blk);
}

TEST_CASE("cpu bf16 ReLU and add store the float32 arithmetic's bits: signed zeros, infinities, NaNs, subnormals",
          "[cpu][bf16]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  // Every bf16 bit pattern (signaling NaNs, which the store quiets, included), then random ones: 65536 + 4007 values,
  // so both the vector loops and their scalar tails run on both threads.
  std::vector<uint16_t> x(65536), z(65536);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  std::mt19937 g(5);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  for (auto& v : z) v = static_cast<uint16_t>(bits(g));
  while (x.size() < 65536 + 4007)
    x.push_back(static_cast<uint16_t>(bits(g))), z.push_back(static_cast<uint16_t>(bits(g)));
  const auto n = static_cast<int64_t>(x.size());
  const size_t bytes = storage_bytes(n, DType::bf16);  // rounded up: the host copies hold that many bytes too
  x.resize(bytes / 2), z.resize(bytes / 2);
  Block* blk = d.allocate_block(bytes * 3);
  const BufferView xb{blk, 0, bytes, DType::bf16}, zb{blk, bytes, bytes, DType::bf16},
      yb{blk, 2 * bytes, bytes, DType::bf16};
  d.copy_from_host(x.data(), xb);
  d.copy_from_host(z.data(), zb);
  std::vector<uint16_t> got(x.size());
  auto count_bad = [&](auto expect) {
    d.copy_to_host(yb, got.data());
    size_t bad = 0;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) bad += got[i] != expect(i);
    return bad;
  };
  auto f = [](uint16_t h) { return bf16_to_float(h); };
  d.run(OpCall{OpKind::ActivationForward, ActivationAttrs{Activation::relu, n}, {xb}, {yb}, {}});
  CHECK(count_bad([&](size_t i) { return float_to_bf16(f(x[i]) < 0.f ? 0.f : f(x[i])); }) == 0);
  // Backward: y = x, dy = z.
  d.run(OpCall{OpKind::ActivationBackward, ActivationAttrs{Activation::relu, n}, {xb, zb}, {yb}, {}});
  CHECK(count_bad([&](size_t i) { return float_to_bf16(f(x[i]) > 0.f ? f(z[i]) : 0.f); }) == 0);
  // add computes 0.5 x - 1.5 z in float32 and rounds once; the reference with and without a fused multiply-add
  // (the compiler may contract either form), so that a wrong rounding or a lost NaN fails while contraction does not.
  d.run(OpCall{OpKind::Add, ElementwiseAttrs{n, 0.5f, -1.5f}, {xb, zb}, {yb}, {}});
  CHECK(count_bad([&](size_t i) {
          const float a = 0.5f * f(x[i]), b = -1.5f * f(z[i]);
          const uint16_t plain = float_to_bf16(a + b), fused = float_to_bf16(std::fma(0.5f, f(x[i]), b));
          return got[i] == fused ? fused : plain;
        }) == 0);
  d.free_block(blk);
}
