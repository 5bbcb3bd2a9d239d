// The CUDA backend on a GPU: every op against the reference, copies, out-of-memory, workspace limits. Without a
// CUDA device each test is skipped with the reason (KILN_SKIP, reported to CTest as Skipped).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "kiln/reference.hpp"
#include "test_cuda_support.hpp"

using namespace kiln;
namespace kc = kiln::test::cuda;

namespace {

using Buffers = std::vector<std::vector<float>>;

struct Case {
  std::string label;
  OpKind kind;
  OpAttrs attrs;
  double rtol = 1e-5, atol = 1e-6;
  bool exact = false;  // bit-identical to the reference (single-rounding ops, dropout masks)
  std::function<void(Buffers& in, Buffers& out, std::mt19937& g)> prepare = nullptr;
};

std::vector<float> random_values(int64_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(g);
  return v;
}

bool tf32() {
  const char* v = std::getenv("KILN_CUDA_TF32");
  return v && std::strcmp(v, "1") == 0;
}

// Runs `c` on the device and on the reference with the same inputs; "" when they agree.
std::string run_case(Device& d, const Case& c, uint32_t seed) {
  std::mt19937 g(seed);
  const OpArity ar = op_arity(c.kind, c.attrs);
  Buffers in, out;
  for (int64_t n : ar.in) in.push_back(random_values(n, g));
  for (int64_t n : ar.out) out.push_back(random_values(n, g));  // read-write outputs start from these
  if (c.prepare) c.prepare(in, out, g);

  Buffers expect = out;
  std::vector<const float*> rin;
  std::vector<float*> rout;
  for (auto& v : in) rin.push_back(v.data());
  for (auto& v : expect) rout.push_back(v.data());
  reference_op(c.kind, c.attrs, rin, rout);

  std::vector<std::unique_ptr<kc::DeviceBuffer>> din, dout;
  OpCall call{c.kind, c.attrs, {}, {}, {}};
  for (auto& v : in) {
    din.push_back(std::make_unique<kc::DeviceBuffer>(d, v));
    call.in.push_back(din.back()->view());
  }
  for (auto& v : out) {
    dout.push_back(std::make_unique<kc::DeviceBuffer>(d, v));
    call.out.push_back(dout.back()->view());
  }
  const size_t ws_bytes = d.workspace_bytes(call);
  kc::DeviceBuffer ws(d, ws_bytes);
  call.workspace = ws.view();
  d.run(call);
  d.synchronize();

  for (size_t o = 0; o < out.size(); ++o) {
    const auto got = dout[o]->download();
    const auto& want = expect[o];
    for (size_t i = 0; i < want.size(); ++i) {
      const float a = got[i], b = want[i];
      bool ok;
      if (std::isnan(b) || std::isnan(a))
        ok = std::isnan(a) && std::isnan(b);
      else if (c.exact)
        ok = std::memcmp(&a, &b, sizeof a) == 0;
      else
        ok = std::fabs(double(a) - double(b)) <= c.atol + c.rtol * std::fabs(double(b));
      if (!ok) {
        std::ostringstream m;
        m.precision(9);
        m << op_name(c.kind) << " [" << c.label << "] output " << o << " element " << i << ": cuda " << a
          << ", reference " << b << (c.exact ? " (must be identical)" : "") << "; repro: kiln_unit_tests "
          << "\"cuda ops match the reference (skipped without a CUDA device)\", case '" << c.label << "', seed "
          << seed;
        return m.str();
      }
    }
  }
  return {};
}

std::vector<Case> op_cases() {
  const double mm_tol = tf32() ? 2e-2 : 1e-4;
  std::vector<Case> cs;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      cs.push_back({"gemm 17x33x9 ta=" + std::to_string(ta) + " tb=" + std::to_string(tb), OpKind::Gemm,
                    GemmAttrs{17, 33, 9, ta, tb, 1.5f, 0.f}, mm_tol, mm_tol});
  cs.push_back({"gemm beta=0.5", OpKind::Gemm, GemmAttrs{64, 48, 200, false, true, 1.f, 0.5f}, mm_tol, mm_tol});
  cs.push_back({"gemm k=0 beta=2", OpKind::Gemm, GemmAttrs{5, 7, 0, false, false, 1.f, 2.f}, 0, 0, true});
  cs.push_back({"gemm 257x129x300", OpKind::Gemm, GemmAttrs{257, 129, 300, true, false, 1.f, 0.f}, mm_tol, mm_tol});

  cs.push_back({"bias_add inner 7", OpKind::BiasAdd, BiasAttrs{3, 5, 7}, 0, 0, true});
  cs.push_back({"bias_grad inner 7", OpKind::BiasGrad, BiasAttrs{3, 5, 7}, 1e-6, 1e-6});
  cs.push_back({"bias_grad dense", OpKind::BiasGrad, BiasAttrs{300, 10, 1}, 1e-6, 1e-6});

  // ConvAttrs: n c h w k r s stride_h stride_w pad_h pad_w oh ow
  const std::vector<std::pair<std::string, ConvAttrs>> convs = {
      {"3x3 same", ConvAttrs{2, 3, 9, 8, 4, 3, 3, 1, 1, 1, 1, 9, 8}},
      {"3x3 stride 2", ConvAttrs{2, 3, 9, 8, 4, 3, 3, 2, 2, 1, 1, 5, 4}},
      {"2x2 same (pad bottom/right only)", ConvAttrs{2, 2, 8, 8, 3, 2, 2, 1, 1, 0, 0, 8, 8}},
      {"3x3 stride 2 no bottom pad", ConvAttrs{1, 2, 5, 5, 2, 3, 3, 2, 2, 1, 1, 2, 2}},
      {"1x1", ConvAttrs{4, 16, 6, 6, 8, 1, 1, 1, 1, 0, 0, 6, 6}},
      {"5x3 rect", ConvAttrs{2, 4, 12, 10, 6, 5, 3, 1, 2, 2, 1, 12, 5}},
  };
  for (const auto& [name, a] : convs)
    for (OpKind k : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter})
      cs.push_back({"conv " + name, k, a, mm_tol, mm_tol});

  // PoolAttrs: n c h w kh kw sh sw ph pw oh ow. Small integers make ties, which decide max-pool gradients.
  auto integer_x = [](Buffers& in, Buffers&, std::mt19937& g) {
    for (auto& v : in[0]) v = std::floor(std::uniform_real_distribution<float>(0.f, 4.f)(g));
  };
  const std::vector<std::pair<std::string, PoolAttrs>> pools = {
      {"2x2/2", PoolAttrs{2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 4, 4}},
      {"3x3/2 pad 1 overlapping", PoolAttrs{2, 2, 9, 7, 3, 3, 2, 2, 1, 1, 5, 4}},
      {"3x3/1 pad 2 (empty windows)", PoolAttrs{1, 2, 4, 4, 3, 3, 1, 1, 2, 2, 6, 6}},
  };
  for (const auto& [name, a] : pools) {
    cs.push_back({"max " + name, OpKind::MaxPoolForward, a, 0, 0, true, integer_x});
    cs.push_back({"avg " + name, OpKind::AvgPoolForward, a, 1e-6, 1e-7});
    cs.push_back({"avg " + name, OpKind::AvgPoolBackward, a, 0, 0, true});
    const PoolAttrs pa = a;
    cs.push_back({"max " + name, OpKind::MaxPoolBackward, a, 0, 0, true,
                  [pa, integer_x](Buffers& in, Buffers& out, std::mt19937& g) {
                    integer_x(in, out, g);
                    const float* x = in[0].data();
                    float* y = in[1].data();
                    reference_op(OpKind::MaxPoolForward, pa, std::span<const float* const>(&x, 1),
                                 std::span<float* const>(&y, 1));
                  }});
  }

  for (Activation act : {Activation::relu, Activation::sigmoid, Activation::tanh}) {
    const std::string n(activation_name(act));
    cs.push_back({n, OpKind::ActivationForward, ActivationAttrs{act, 1000}, 2e-6, 1e-7,
                  act == Activation::relu});
    cs.push_back({n, OpKind::ActivationBackward, ActivationAttrs{act, 1000}, 1e-6, 1e-7, act == Activation::relu});
  }
  cs.push_back({"softmax 7x10", OpKind::SoftmaxForward, SoftmaxAttrs{7, 10}, 1e-6, 1e-7});
  cs.push_back({"softmax 3x1000", OpKind::SoftmaxForward, SoftmaxAttrs{3, 1000}, 1e-6, 1e-7});
  cs.push_back({"softmax 7x10", OpKind::SoftmaxBackward, SoftmaxAttrs{7, 10}, 1e-6, 1e-7});
  auto labels = [](Buffers& in, Buffers&, std::mt19937&) {
    for (size_t r = 0; r < in[1].size(); ++r) in[1][r] = static_cast<float>((r * 7) % 10);
  };
  cs.push_back({"xent 33x10", OpKind::SoftmaxCrossEntropy, LossAttrs{33, 10, 1.f / 33, true}, 1e-6, 1e-7, false,
                labels});
  cs.push_back({"xent bad label", OpKind::SoftmaxCrossEntropy, LossAttrs{4, 10, 0.25f, true}, 1e-6, 1e-7, false,
                [](Buffers& in, Buffers&, std::mt19937&) { in[1] = {1.f, 12.f, -1.f, 3.f}; }});
  cs.push_back({"mse", OpKind::MeanSquaredError, LossAttrs{50, 30, 0.5f, true}, 1e-6, 1e-7});
  cs.push_back({"bce logits", OpKind::BinaryCrossEntropy, LossAttrs{20, 7, 0.1f, true}, 1e-6, 1e-7});
  cs.push_back({"bce probabilities", OpKind::BinaryCrossEntropy, LossAttrs{20, 7, 0.1f, false}, 1e-6, 1e-7, false,
                [](Buffers& in, Buffers&, std::mt19937& g) {
                  in[0] = random_values(static_cast<int64_t>(in[0].size()), g, 0.01f, 0.99f);
                  in[1] = random_values(static_cast<int64_t>(in[1].size()), g, 0.f, 1.f);
                }});

  for (OpKind k : {OpKind::Add, OpKind::Mul, OpKind::Axpby, OpKind::Scale, OpKind::Fill, OpKind::Copy})
    cs.push_back({"count 4099", k, ElementwiseAttrs{4099, 0.75f, -1.25f}, 0, 0, true});
  cs.push_back({"columns", OpKind::ReduceSum, ReduceAttrs{3, 17, 40}, 1e-6, 1e-6});
  cs.push_back({"long rows", OpKind::ReduceSum, ReduceAttrs{4, 5000, 1}, 1e-6, 1e-6});
  cs.push_back({"3 parts", OpKind::Concat, ConcatAttrs{4, 3, {2, 5, 1}}, 0, 0, true});
  cs.push_back({"3 parts", OpKind::Split, ConcatAttrs{4, 3, {2, 5, 1}}, 0, 0, true});
  cs.push_back({"rate 0.3", OpKind::DropoutForward, DropoutAttrs{10000, 0.3f, 1234u, 7u}, 0, 0, true});
  cs.push_back({"rate 0.5", OpKind::DropoutBackward, DropoutAttrs{10000, 0.5f, 99u, 3u}, 0, 0, true});

  // Optimizers run in double like the reference; identical up to the last bit is expected, 1e-6 is allowed.
  cs.push_back({"nesterov wd", OpKind::SgdUpdate, SgdAttrs{5000, 0.1f, 0.9f, 1e-4f, true}, 1e-6, 1e-7});
  cs.push_back({"no momentum", OpKind::SgdUpdate, SgdAttrs{5000, 0.1f, 0.f, 0.f, false}, 1e-6, 1e-7});
  auto nonneg = [](size_t idx) {
    return [idx](Buffers&, Buffers& out, std::mt19937&) {
      for (auto& v : out[idx]) v = std::fabs(v);
    };
  };
  cs.push_back({"t=3", OpKind::AdamUpdate, AdamAttrs{5000, 1e-3f, 0.9f, 0.999f, 1e-7f, 1e-2f, 3}, 1e-6, 1e-7, false,
                nonneg(2)});
  cs.push_back({"momentum", OpKind::RmspropUpdate, RmspropAttrs{5000, 1e-2f, 0.9f, 1e-7f, 0.5f}, 1e-6, 1e-7, false,
                nonneg(1)});
  cs.push_back({"plain", OpKind::RmspropUpdate, RmspropAttrs{5000, 1e-2f, 0.9f, 1e-7f, 0.f}, 1e-6, 1e-7, false,
                nonneg(1)});
  cs.push_back({"decay 0.99", OpKind::EmaUpdate, EmaAttrs{5000, 0.99f}, 1e-6, 1e-7});
  return cs;
}

}  // namespace

TEST_CASE("cuda ops match the reference (skipped without a CUDA device)", "[cuda]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  uint32_t seed = 1000;
  for (const auto& c : op_cases()) {
    INFO(op_name(c.kind) << " [" << c.label << "]");
    CHECK(run_case(*d, c, seed++) == "");
  }
}

TEST_CASE("cuda convolutions stay within the workspace limit (skipped without a CUDA device)", "[cuda]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  auto* limit = static_cast<size_t*>(d->extension("cuda.workspace_limit"));
  REQUIRE(limit);
  *limit = 0;
  const ConvAttrs same{4, 8, 16, 16, 8, 3, 3, 1, 1, 1, 1, 16, 16};
  OpCall fwd{OpKind::Conv2dForward, same, {}, {}, {}};
  CHECK(d->workspace_bytes(fwd) == 0);  // implicit GEMM needs none
  for (OpKind k : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
    INFO(op_name(k));
    CHECK(run_case(*d, Case{"limit 0", k, same, 1e-4, 1e-4}, 7) == "");
  }
  // An asymmetric shape needs its padded copy and nothing more.
  const ConvAttrs asym{2, 2, 8, 8, 3, 2, 2, 1, 1, 0, 0, 8, 8};
  OpCall a{OpKind::Conv2dForward, asym, {}, {}, {}};
  CHECK(d->workspace_bytes(a) == 1536);  // 2*2*9*9 floats (1296 bytes) rounded up to 256 bytes
  const std::string report = static_cast<const char*>(d->extension("cuda.conv_report"));
  CHECK_THAT(report, Catch::Contains("explicit padding"));
}

TEST_CASE("cuda device returns no block when memory runs out and stays usable (skipped without a CUDA device)",
          "[cuda]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  CHECK(d->allocate_block(d->info().total_memory * 2) == nullptr);
  Block* b = d->allocate_block(1 << 20);
  REQUIRE(b);
  CHECK(b->bytes == (1u << 20));
  d->free_block(b);
  CHECK(d->query_free_memory() > 0);
}

TEST_CASE("cuda copies round-trip, also past one pinned staging chunk (skipped without a CUDA device)", "[cuda]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  std::mt19937 g(5);
  const auto v = random_values((20 << 20) / 4 + 3, g);  // 20 MiB and a bit: three staging chunks
  kc::DeviceBuffer a(*d, v), b(*d, v.size() * sizeof(float));
  d->copy_on_device(a.view(), b.view());
  CHECK(b.download() == v);
  BufferView part{a.view().block, 4096, 64};
  std::vector<float> small(16);
  d->copy_to_host(part, small.data());
  CHECK(std::equal(small.begin(), small.end(), v.begin() + 1024));
  CHECK_THROWS_AS(d->copy_on_device(a.view(), BufferView{b.view().block, 0, 8}), DeviceError);
}

TEST_CASE("cuda op with a buffer too small is refused naming the op (skipped without a CUDA device)", "[cuda]") {
  std::string why;
  auto d = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(d, why);
  kc::DeviceBuffer x(*d, 64), y(*d, 64);
  OpCall c{OpKind::Scale, ElementwiseAttrs{100, 2.f, 0.f}, {x.view()}, {y.view()}, {}};
  CHECK_THROWS_WITH(d->run(c), Catch::Contains("scale") && Catch::Contains("400 bytes"));
  CHECK_FALSE(d->supports(OpKind::Gemm, ElementwiseAttrs{}).yes);
}

TEST_CASE("nccl all-reduce sums and broadcast copies across the CUDA devices (skipped without a CUDA device)",
          "[cuda]") {
  std::string why;
  auto b = kc::backend_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(b, why);
  const auto infos = b->enumerate();
  if (infos.empty()) {
    KILN_SKIP("no CUDA device: " << b->unavailable_reason());
  }
  if (!test::registry().has_communicator("nccl")) {
    KILN_SKIP("this build has no NCCL");
  }
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<Device*> ptrs;
  for (size_t i = 0; i < infos.size(); ++i) {
    devs.push_back(b->open(static_cast<int>(i)));
    ptrs.push_back(devs.back().get());
  }
  auto comm = test::registry().communicator("nccl")(ptrs);
  REQUIRE(comm->size() == static_cast<int>(ptrs.size()));
  const int64_t n = 1000;
  std::vector<std::unique_ptr<kc::DeviceBuffer>> bufs;
  std::vector<BufferView> views;
  for (size_t r = 0; r < ptrs.size(); ++r) {
    bufs.push_back(std::make_unique<kc::DeviceBuffer>(*ptrs[r], std::vector<float>(n, float(r + 1))));
    views.push_back(bufs.back()->view());
  }
  comm->all_reduce_sum(views, ptrs);
  const float sum = float(ptrs.size() * (ptrs.size() + 1) / 2);
  for (auto& buf : bufs) CHECK(buf->download() == std::vector<float>(n, sum));
  for (size_t r = 0; r < ptrs.size(); ++r) bufs[r]->upload(std::vector<float>(n, float(10 * r)));
  const int root = static_cast<int>(ptrs.size()) - 1;
  comm->broadcast(views, ptrs, root);
  for (auto& buf : bufs) CHECK(buf->download() == std::vector<float>(n, float(10 * root)));
}
