// The CUDA backend on a GPU: copies, out-of-memory, workspace limits. Every op against the reference is the
// conformance table's job (tests/conformance). Without a CUDA device each test is skipped with the reason
// (KILN_SKIP, reported to CTest as Skipped).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "kiln/op_table.hpp"
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

}  // namespace

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
  // The op contract is checked once, when the executor binds the call (the device trusts bound calls).
  CHECK_THROWS_WITH(check_call(c, d->info().label()), Catch::Contains("scale") && Catch::Contains("400 bytes"));
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
