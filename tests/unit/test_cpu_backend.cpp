// The CPU backend: devices, memory and every op against the reference over a table of shapes (tiny, odd,
// prime, larger; strides, paddings, transposes, beta != 0, allowed aliasing), on 1, 2 and 3 threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;
using Vec = std::vector<float>;

namespace {

struct Opened {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
};

Opened open_cpu(int threads, int virtual_devices = 1, int index = 0) {
  Opened r;
  r.backend = test::registry().backend("cpu")(BackendOptions::parse(
      "threads = " + std::to_string(threads) + "\nvirtual_devices = " + std::to_string(virtual_devices)));
  r.device = r.backend->open(index);
  return r;
}

// One device block holding several buffers at 256-byte aligned offsets (so offsets are exercised).
class Arena {
 public:
  Arena(Device& d, const std::vector<int64_t>& sizes) : d_(d) {
    size_t total = 256;  // the first buffer starts at a non-zero offset
    for (int64_t s : sizes) {
      offsets_.push_back(total);
      total += (static_cast<size_t>(s) * sizeof(float) + 255) / 256 * 256 + 256;
    }
    block_ = d_.allocate_block(total);
    REQUIRE(block_ != nullptr);
    for (size_t i = 0; i < sizes.size(); ++i)
      views_.push_back(BufferView{block_, offsets_[i], static_cast<size_t>(sizes[i]) * sizeof(float)});
  }
  ~Arena() { d_.free_block(block_); }
  const BufferView& view(size_t i) const { return views_[i]; }

 private:
  Device& d_;
  Block* block_ = nullptr;
  std::vector<size_t> offsets_;
  std::vector<BufferView> views_;
};

Vec random_vec(int64_t n, std::mt19937& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// A case: the op, its attrs, how to prepare inputs / read-write outputs, and which outputs run in place.
struct OpCase {
  OpKind kind;
  OpAttrs attrs;
  std::string desc;
  std::function<void(std::vector<Vec>& in, std::vector<Vec>& out, std::mt19937& g)> prepare = nullptr;
  std::vector<std::pair<int, int>> alias = {};  // (output, input) sharing one buffer
};

// Outputs the op reads before writing: they start equal on both sides. Others start as NaN on the device.
bool read_write(OpKind k, const OpAttrs& a, size_t out) {
  switch (k) {
    case OpKind::Gemm:
      return std::get<GemmAttrs>(a).beta != 0.f;
    case OpKind::Axpby:
    case OpKind::SgdUpdate:
    case OpKind::AdamUpdate:
    case OpKind::RmspropUpdate:
    case OpKind::EmaUpdate:
      return true;
    default:
      (void)out;
      return false;
  }
}

// Tolerances in one place: |cpu - ref| <= atol + 2e-5 |ref|, atol growing with the reduction length.
double atol_for(OpKind k, const OpAttrs& at) {
  const double per = 3e-7;
  switch (k) {
    case OpKind::Gemm:
      return per * double(std::get<GemmAttrs>(at).k + 1) * 4;
    case OpKind::Conv2dForward: {
      const auto& a = std::get<ConvAttrs>(at);
      return per * double(a.c * a.r * a.s + 1) * 4;
    }
    case OpKind::Conv2dBackwardData: {
      const auto& a = std::get<ConvAttrs>(at);
      return per * double(a.k * a.r * a.s + 1) * 4;
    }
    case OpKind::Conv2dBackwardFilter: {
      const auto& a = std::get<ConvAttrs>(at);
      return per * double(a.n * a.oh * a.ow + 1) * 4;
    }
    case OpKind::BiasGrad: {
      const auto& a = std::get<BiasAttrs>(at);
      return per * double(a.outer * a.inner + 1);
    }
    case OpKind::ReduceSum:
      return per * double(std::get<ReduceAttrs>(at).reduce + 1);
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::MeanSquaredError:
    case OpKind::BinaryCrossEntropy: {
      const auto& a = std::get<LossAttrs>(at);
      return per * double(a.rows * a.cols + 1);
    }
    default:
      return 1e-6;
  }
}

void run_case(Device& dev, const OpCase& c, uint32_t seed) {
  const OpArity ar = op_arity(c.kind, c.attrs);
  std::mt19937 g(seed);
  std::vector<Vec> in, out;
  for (int64_t n : ar.in) in.push_back(random_vec(n, g));
  for (int64_t n : ar.out) out.push_back(random_vec(n, g));
  if (c.prepare) c.prepare(in, out, g);
  for (auto [o, i] : c.alias) out[size_t(o)] = in[size_t(i)];

  // Reference on host copies; aliased outputs point at their input.
  std::vector<Vec> rin = in, rout = out;
  std::vector<const float*> ip;
  std::vector<float*> op;
  for (auto& v : rin) ip.push_back(v.data());
  for (auto& v : rout) op.push_back(v.data());
  for (auto [o, i] : c.alias) op[size_t(o)] = rin[size_t(i)].data();
  reference_op(c.kind, c.attrs, ip, op);
  for (auto [o, i] : c.alias) rout[size_t(o)] = rin[size_t(i)];

  // Device: one arena, write-only outputs poisoned with NaN.
  std::vector<int64_t> sizes(ar.in.begin(), ar.in.end());
  sizes.insert(sizes.end(), ar.out.begin(), ar.out.end());
  Arena arena(dev, sizes);
  OpCall call;
  call.kind = c.kind;
  call.attrs = c.attrs;
  for (size_t i = 0; i < in.size(); ++i) {
    call.in.push_back(arena.view(i));
    if (!in[i].empty()) dev.copy_from_host(in[i].data(), arena.view(i));
  }
  for (size_t o = 0; o < out.size(); ++o) {
    BufferView v = arena.view(in.size() + o);
    for (auto [ao, ai] : c.alias)
      if (size_t(ao) == o) v = arena.view(size_t(ai));
    call.out.push_back(v);
    Vec init = read_write(c.kind, c.attrs, o) ? out[o] : Vec(out[o].size(), NAN);
    bool aliased = false;
    for (auto [ao, ai] : c.alias) aliased |= size_t(ao) == o;
    if (!aliased && !init.empty()) dev.copy_from_host(init.data(), v);
  }
  const size_t ws_bytes = dev.workspace_bytes(call);
  Block* ws = ws_bytes ? dev.allocate_block(ws_bytes) : nullptr;
  if (ws) call.workspace = BufferView{ws, 0, ws_bytes};
  dev.run(call);
  dev.synchronize();
  if (ws) dev.free_block(ws);

  const double atol = atol_for(c.kind, c.attrs);
  for (size_t o = 0; o < out.size(); ++o) {
    Vec got(rout[o].size());
    if (!got.empty()) dev.copy_to_host(call.out[o], got.data());
    double worst = 0;
    size_t worst_i = 0;
    bool ok = true;
    for (size_t i = 0; i < got.size(); ++i) {
      const double r = rout[o][i], d = got[i];
      const bool same_nan = std::isnan(r) && std::isnan(d);
      const double err = std::abs(d - r);
      if (!same_nan && !(err <= atol + 2e-5 * std::abs(r))) {
        if (ok || err > worst || std::isnan(err)) worst = err, worst_i = i;
        ok = false;
      }
    }
    INFO("repro: " << op_name(c.kind) << " " << c.desc << " output " << o << " element " << worst_i << " cpu "
                   << (got.empty() ? 0.f : got[worst_i]) << " ref " << (rout[o].empty() ? 0.f : rout[o][worst_i])
                   << " atol " << atol);
    CHECK(ok);
  }
}

void run_table(const std::vector<OpCase>& cases) {
  for (int threads : {1, 2, 3}) {
    auto cpu = open_cpu(threads);
    uint32_t seed = 1;
    for (const auto& c : cases) {
      INFO("threads " << threads);
      run_case(*cpu.device, c, seed++);
    }
  }
}

std::string str(std::initializer_list<int64_t> v) {
  std::ostringstream s;
  for (auto x : v) s << x << ' ';
  return s.str();
}

}  // namespace

TEST_CASE("cpu backend enumerates virtual devices with host memory and distinct hardware ids", "[cpu]") {
  auto be = test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 2"));
  CHECK(be->name() == "cpu");
  auto devs = be->enumerate();
  REQUIRE(devs.size() == 2);
  for (const auto& d : devs) {
    CHECK(d.type == DeviceType::cpu);
    CHECK(d.host_addressable);
  }
  CHECK(devs[0].hardware_id == "host-cpu:0");
  CHECK(devs[1].hardware_id == "host-cpu:1");
  CHECK(devs[1].label() == "cpu:1");
  CHECK_THAT(devs[0].name, Catch::Contains("logical 0 of 2"));
  CHECK(devs[0].total_memory > 0);
  CHECK(devs[0].free_memory > 0);
  CHECK(devs[0].free_memory <= devs[0].total_memory);
  auto d1 = be->open(1);
  CHECK(d1->info().index == 1);
  CHECK(d1->query_free_memory() > 0);
  auto d0 = be->open(0);
  CHECK(d0.get() != d1.get());
}

TEST_CASE("cpu backend open with a bad index throws DeviceError naming the index and the devices present", "[cpu]") {
  auto be = test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 2"));
  CHECK_THROWS_AS(be->open(2), DeviceError);
  CHECK_THROWS_WITH(be->open(2), Catch::Contains("cpu:2") && Catch::Contains("cpu:0") && Catch::Contains("cpu:1"));
  CHECK_THROWS_AS(be->open(-1), DeviceError);
  CHECK_THROWS_WITH(test::registry().backend("cpu")(BackendOptions::parse("virtual_devices = 0")),
                    Catch::Contains("device.virtual_devices") && Catch::Contains("1..64"));
  CHECK_THROWS_WITH(test::registry().backend("cpu")(BackendOptions::parse("threads = -1")),
                    Catch::Contains("device.threads") && Catch::Contains("positive"));
}

TEST_CASE("cpu device blocks are 64-byte aligned, copies round-trip, impossible sizes return nullptr", "[cpu]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  Block* a = d.allocate_block(1000);
  Block* b = d.allocate_block(1000);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(reinterpret_cast<uintptr_t>(a->ptr) % 64 == 0);
  CHECK(a->id != b->id);
  CHECK(a->bytes == 1000);
  Vec src{1, 2, 3, 4}, dst(4);
  d.copy_from_host(src.data(), BufferView{a, 64, 16});
  d.copy_on_device(BufferView{a, 64, 16}, BufferView{b, 128, 16});
  d.copy_to_host(BufferView{b, 128, 16}, dst.data());
  CHECK(dst == src);
  CHECK_THROWS_AS(d.copy_on_device(BufferView{a, 0, 16}, BufferView{b, 0, 8}), DeviceError);
  CHECK_THROWS_AS(d.copy_from_host(src.data(), BufferView{a, 996, 16}), DeviceError);
  d.free_block(a);
  d.free_block(b);
  CHECK(d.allocate_block(size_t(1) << 62) == nullptr);
  d.free_block(nullptr);
  CHECK(d.supports(OpKind::Conv2dBackwardFilter, ConvAttrs{}).yes);
}

TEST_CASE("cpu device rejects wrong buffer counts, short buffers, missing workspace and forbidden overlaps", "[cpu]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  Arena arena(d, {16, 16, 16, 8});
  OpCall c;
  c.kind = OpKind::Gemm;
  c.attrs = GemmAttrs{4, 4, 4};
  c.in = {arena.view(0)};
  c.out = {arena.view(2)};
  CHECK_THROWS_WITH(d.run(c), Catch::Contains("gemm") && Catch::Contains("expected 2 inputs"));
  c.in = {arena.view(0), arena.view(3)};
  CHECK_THROWS_WITH(d.run(c), Catch::Contains("input 1") && Catch::Contains("expected 64 bytes"));
  c.in = {arena.view(0), arena.view(1)};
  c.out = {arena.view(0)};
  CHECK_THROWS_WITH(d.run(c), Catch::Contains("overlaps input 0"));
  c.attrs = ConvAttrs{};
  CHECK_THROWS_WITH(d.run(c), Catch::Contains("attributes of the wrong type"));

  OpCall conv;
  conv.kind = OpKind::Conv2dForward;
  conv.attrs = ConvAttrs{1, 1, 4, 4, 1, 3, 3, 1, 1, 1, 1, 4, 4};
  conv.in = {arena.view(0), arena.view(3)};
  conv.out = {arena.view(1)};
  REQUIRE(d.workspace_bytes(conv) > 0);
  CHECK_THROWS_WITH(d.run(conv), Catch::Contains("workspace"));
  conv.attrs = ConvAttrs{1, 1, 4, 4, 1, 3, 3, 0, 1, 1, 1, 4, 4};
  CHECK_THROWS_WITH(d.run(conv), Catch::Contains("stride_h must be >= 1"));

  // Allowed: in-place relu; SGD without momentum with v == w.
  OpCall relu;
  relu.kind = OpKind::ActivationForward;
  relu.attrs = ActivationAttrs{Activation::relu, 16};
  relu.in = {arena.view(0)};
  relu.out = {arena.view(0)};
  CHECK_NOTHROW(d.run(relu));
  OpCall sgd;
  sgd.kind = OpKind::SgdUpdate;
  sgd.attrs = SgdAttrs{16, 0.1f, 0.f};
  sgd.in = {arena.view(1)};
  sgd.out = {arena.view(0), arena.view(0)};
  CHECK_NOTHROW(d.run(sgd));
  std::get<SgdAttrs>(sgd.attrs).momentum = 0.9f;
  CHECK_THROWS_WITH(d.run(sgd), Catch::Contains("outputs 0 and 1 overlap"));
}

TEST_CASE("cpu gemm matches the reference over shapes, transposes, alpha and beta", "[cpu]") {
  std::vector<OpCase> cases;
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1},     {2, 3, 4},       {7, 5, 3},     {13, 17, 19},
                                                      {64, 33, 128}, {31, 257, 5},    {300, 40, 50}, {3, 4, 0},
                                                      {0, 4, 3},     {128, 256, 784}, {32, 10, 256}};
  for (auto [m, n, k] : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [al, be] : {std::pair{1.f, 0.f}, std::pair{0.5f, -1.5f}})
          cases.push_back({OpKind::Gemm, GemmAttrs{m, n, k, ta, tb, al, be},
                           "m n k ta tb = " + str({m, n, k, ta, tb}) + "alpha " + std::to_string(al) + " beta " +
                               std::to_string(be)});
  run_table(cases);
}

TEST_CASE("cpu conv2d forward and both backward passes match the reference", "[cpu]") {
  auto conv = [](int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s, int64_t sh, int64_t sw,
                 int64_t ph, int64_t pw, int64_t oh = -1, int64_t ow = -1) {
    if (oh < 0) oh = (h + 2 * ph - r) / sh + 1;
    if (ow < 0) ow = (w + 2 * pw - s) / sw + 1;
    return ConvAttrs{n, c, h, w, k, r, s, sh, sw, ph, pw, oh, ow};
  };
  const std::vector<ConvAttrs> shapes = {
      conv(1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0),    conv(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1),
      conv(3, 2, 9, 11, 5, 3, 2, 2, 3, 1, 0),   conv(4, 5, 6, 6, 3, 1, 1, 1, 1, 0, 0),  // pointwise fast path
      conv(2, 3, 8, 8, 4, 1, 1, 2, 2, 0, 0),    conv(5, 3, 13, 13, 7, 5, 5, 2, 2, 2, 2),
      conv(1, 2, 4, 4, 3, 5, 5, 1, 1, 2, 2),    conv(3, 2, 5, 5, 2, 3, 3, 2, 2, 1, 1, 2, 2),  // oh below full
      conv(6, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1), conv(2, 32, 14, 14, 64, 3, 3, 1, 1, 0, 0),
      conv(7, 3, 3, 3, 2, 3, 3, 1, 1, 0, 0),    conv(1, 4, 9, 7, 3, 2, 4, 3, 1, 0, 3)};
  std::vector<OpCase> cases;
  for (const auto& a : shapes) {
    const std::string d = "n c h w k r s sh sw ph pw oh ow = " + str({a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.stride_h,
                                                                      a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow});
    for (OpKind k : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter})
      cases.push_back({k, a, d});
  }
  run_table(cases);
}

TEST_CASE("cpu conv2d backward filter is bit-identical across runs", "[cpu]") {
  auto cpu = open_cpu(2);
  ConvAttrs a{9, 3, 10, 10, 8, 3, 3, 1, 1, 1, 1, 10, 10};
  const auto ar = op_arity(OpKind::Conv2dBackwardFilter, a);
  std::mt19937 g(5);
  Vec x = random_vec(ar.in[0], g), dy = random_vec(ar.in[1], g);
  Arena arena(*cpu.device, {ar.in[0], ar.in[1], ar.out[0]});
  cpu.device->copy_from_host(x.data(), arena.view(0));
  cpu.device->copy_from_host(dy.data(), arena.view(1));
  OpCall c{OpKind::Conv2dBackwardFilter, a, {arena.view(0), arena.view(1)}, {arena.view(2)}, {}};
  const size_t ws = cpu.device->workspace_bytes(c);
  Block* b = cpu.device->allocate_block(ws);
  c.workspace = BufferView{b, 0, ws};
  Vec first(ar.out[0]), second(ar.out[0]);
  cpu.device->run(c);
  cpu.device->copy_to_host(arena.view(2), first.data());
  cpu.device->run(c);
  cpu.device->copy_to_host(arena.view(2), second.data());
  cpu.device->free_block(b);
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

TEST_CASE("cpu pooling matches the reference, including ties, padding and empty windows", "[cpu]") {
  const std::vector<PoolAttrs> shapes = {
      {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 4, 4}, {1, 2, 7, 7, 2, 2, 2, 2, 0, 0, 3, 3},
      {2, 2, 7, 9, 3, 3, 2, 2, 1, 1, 4, 5}, {1, 1, 5, 5, 3, 3, 1, 1, 1, 1, 5, 5},
      {3, 4, 6, 6, 3, 2, 3, 2, 0, 1, 2, 4}, {64, 32, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14},
      {1, 1, 3, 3, 2, 2, 2, 2, 2, 2, 4, 4},  // windows that hold only padding
  };
  std::vector<OpCase> cases;
  for (const auto& a : shapes)
    for (bool ties : {false, true}) {
      const std::string d =
          "n c h w kh kw sh sw ph pw oh ow = " +
          str({a.n, a.c, a.h, a.w, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow}) +
          (ties ? "(integer inputs with ties)" : "");
      auto quantize = [ties](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937&) {
        if (ties)
          for (auto& v : in[0]) v = std::round(v * 2.f);
      };
      cases.push_back({OpKind::MaxPoolForward, a, d, quantize});
      cases.push_back({OpKind::AvgPoolForward, a, d, quantize});
      cases.push_back({OpKind::AvgPoolBackward, a, d});
      cases.push_back(
          {OpKind::MaxPoolBackward, a, d, [a, ties](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937&) {
             if (ties)
               for (auto& v : in[0]) v = std::round(v * 2.f);
             const float* xp = in[0].data();
             float* yp = in[1].data();
             reference_op(OpKind::MaxPoolForward, a, std::span<const float* const>(&xp, 1),
                          std::span<float* const>(&yp, 1));
           }});
    }
  run_table(cases);
}

TEST_CASE("cpu activations and softmax match the reference, in place where allowed", "[cpu]") {
  std::vector<OpCase> cases;
  auto widen = [](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937&) {
    for (auto& v : in[0]) v *= 6.f;  // exercise the saturated parts of sigmoid and tanh
  };
  for (int64_t n : {1, 7, 1000, 70001})
    for (Activation act : {Activation::relu, Activation::sigmoid, Activation::tanh}) {
      const std::string d = std::string(activation_name(act)) + " count " + std::to_string(n);
      cases.push_back({OpKind::ActivationForward, ActivationAttrs{act, n}, d, widen});
      cases.push_back({OpKind::ActivationForward, ActivationAttrs{act, n}, d + " in place", widen, {{0, 0}}});
      cases.push_back({OpKind::ActivationBackward, ActivationAttrs{act, n}, d});
      cases.push_back({OpKind::ActivationBackward, ActivationAttrs{act, n}, d + " dx aliases dy", nullptr, {{0, 1}}});
    }
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 10}, {64, 10}, {1000, 100}, {2, 1031}}) {
    const std::string d = "rows cols = " + str({rows, cols});
    cases.push_back({OpKind::SoftmaxForward, SoftmaxAttrs{rows, cols}, d, widen});
    cases.push_back({OpKind::SoftmaxBackward, SoftmaxAttrs{rows, cols}, d});
  }
  run_table(cases);
}

TEST_CASE("cpu fused losses match the reference in value and gradient", "[cpu]") {
  std::vector<OpCase> cases;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 10}, {64, 10}, {512, 100}, {7, 3}})
    for (float scale : {1.f, 1.f / float(rows)}) {
      const std::string d = "rows cols = " + str({rows, cols}) + "scale " + std::to_string(scale);
      const int64_t c = cols;
      cases.push_back({OpKind::SoftmaxCrossEntropy, LossAttrs{rows, cols, scale}, d,
                       [c](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937& g) {
                         for (auto& v : in[0]) v *= 5.f;
                         for (auto& l : in[1]) l = float(std::uniform_int_distribution<int64_t>(0, c - 1)(g));
                       }});
      cases.push_back({OpKind::MeanSquaredError, LossAttrs{rows, cols, scale}, d});
      cases.push_back({OpKind::BinaryCrossEntropy, LossAttrs{rows, cols, scale, true}, d + " logits",
                       [](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937&) {
                         for (auto& v : in[0]) v *= 8.f;
                         for (auto& t : in[1]) t = 0.5f * (t + 1.f);
                       }});
      cases.push_back({OpKind::BinaryCrossEntropy, LossAttrs{rows, cols, scale, false}, d + " probabilities",
                       [](std::vector<Vec>& in, std::vector<Vec>&, std::mt19937&) {
                         for (auto& v : in[0]) v = 0.5f + 0.45f * v;
                         for (auto& t : in[1]) t = 0.5f * (t + 1.f);
                       }});
    }
  run_table(cases);
}

TEST_CASE("cpu softmax cross-entropy reports NaN for an out-of-range label and relu keeps NaN", "[cpu]") {
  auto cpu = open_cpu(1);
  Device& d = *cpu.device;
  Arena arena(d, {6, 2, 1, 6});
  Vec x{1, 2, 3, 4, 5, 6}, labels{1, 3};
  d.copy_from_host(x.data(), arena.view(0));
  d.copy_from_host(labels.data(), arena.view(1));
  d.run(OpCall{OpKind::SoftmaxCrossEntropy,
               LossAttrs{2, 3},
               {arena.view(0), arena.view(1)},
               {arena.view(2), arena.view(3)},
               {}});
  float loss = 0;
  d.copy_to_host(arena.view(2), &loss);
  CHECK(std::isnan(loss));
  Vec nan{NAN, -1.f};
  d.copy_from_host(nan.data(), BufferView{arena.view(0).block, arena.view(0).offset, 8});
  BufferView v{arena.view(0).block, arena.view(0).offset, 8};
  d.run(OpCall{OpKind::ActivationForward, ActivationAttrs{Activation::relu, 2}, {v}, {v}, {}});
  d.copy_to_host(v, nan.data());
  CHECK(std::isnan(nan[0]));
  CHECK(nan[1] == 0.f);
}

TEST_CASE("cpu bias, elementwise, reduce, concat and split match the reference", "[cpu]") {
  std::vector<OpCase> cases;
  for (auto [o, c, i] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {4, 3, 1}, {2, 5, 7}, {64, 32, 196}, {128, 256, 1}, {3, 200, 1}, {1, 3, 70000}}) {
    const std::string d = "outer channels inner = " + str({o, c, i});
    cases.push_back({OpKind::BiasAdd, BiasAttrs{o, c, i}, d});
    cases.push_back({OpKind::BiasAdd, BiasAttrs{o, c, i}, d + " in place", nullptr, {{0, 0}}});
    cases.push_back({OpKind::BiasGrad, BiasAttrs{o, c, i}, d});
  }
  for (int64_t n : {0, 1, 7, 100, 70001}) {
    const std::string d = "count " + std::to_string(n);
    for (OpKind k : {OpKind::Add, OpKind::Mul}) {
      cases.push_back({k, ElementwiseAttrs{n, 0.5f, -2.f}, d});
      cases.push_back({k, ElementwiseAttrs{n, 0.5f, -2.f}, d + " y aliases a", nullptr, {{0, 0}}});
      cases.push_back({k, ElementwiseAttrs{n, 0.5f, -2.f}, d + " y aliases b", nullptr, {{0, 1}}});
    }
    cases.push_back({OpKind::Axpby, ElementwiseAttrs{n, 1.5f, -0.25f}, d});
    cases.push_back({OpKind::Scale, ElementwiseAttrs{n, -3.f}, d});
    cases.push_back({OpKind::Scale, ElementwiseAttrs{n, -3.f}, d + " in place", nullptr, {{0, 0}}});
    cases.push_back({OpKind::Fill, ElementwiseAttrs{n, 2.5f}, d});
    cases.push_back({OpKind::Copy, ElementwiseAttrs{n}, d});
  }
  for (auto [o, r, i] : std::vector<std::array<int64_t, 3>>{
           {1, 5, 1}, {3, 7, 2}, {2, 300, 257}, {64, 10, 1}, {1, 100000, 1}, {5, 0, 3}, {1, 2, 40000}})
    cases.push_back({OpKind::ReduceSum, ReduceAttrs{o, r, i}, "outer reduce inner = " + str({o, r, i})});
  for (const auto& a : std::vector<ConcatAttrs>{
           {1, 1, {3}}, {2, 3, {1, 2, 3}}, {5, 7, {4, 0, 2}}, {64, 1, {100, 28}}, {300, 50, {2, 3}}}) {
    std::string d = "outer " + std::to_string(a.outer) + " inner " + std::to_string(a.inner) + " sizes ";
    for (auto s : a.sizes) d += std::to_string(s) + " ";
    cases.push_back({OpKind::Concat, a, d});
    cases.push_back({OpKind::Split, a, d});
  }
  run_table(cases);
}

TEST_CASE("cpu dropout matches the reference mask bit for bit, forward and backward", "[cpu]") {
  std::vector<OpCase> cases;
  for (int64_t n : {1, 17, 1000, 70001})
    for (float rate : {0.f, 0.3f, 0.5f, 1.f})
      for (OpKind k : {OpKind::DropoutForward, OpKind::DropoutBackward}) {
        const std::string d = "count " + std::to_string(n) + " rate " + std::to_string(rate);
        cases.push_back({k, DropoutAttrs{n, rate, 42u, 9u}, d});
        cases.push_back({k, DropoutAttrs{n, rate, 7u, 123456u}, d + " in place", nullptr, {{0, 0}}});
      }
  run_table(cases);
}

TEST_CASE("cpu optimizer updates match the reference", "[cpu]") {
  std::vector<OpCase> cases;
  auto positive_state = [](std::vector<Vec>&, std::vector<Vec>& out, std::mt19937&) {
    for (auto& v : out[out.size() == 3 ? 2 : 1]) v = std::abs(v);  // Adam's v
  };
  auto positive_sq = [](std::vector<Vec>&, std::vector<Vec>& out, std::mt19937&) {
    for (auto& v : out[1]) v = std::abs(v);  // RMSprop's sq
  };
  for (int64_t n : {1, 17, 1000, 70001}) {
    const std::string d = "count " + std::to_string(n);
    cases.push_back({OpKind::SgdUpdate, SgdAttrs{n, 0.1f, 0.f, 0.f, false}, d + " plain"});
    cases.push_back({OpKind::SgdUpdate, SgdAttrs{n, 0.1f, 0.9f, 1e-2f, false}, d + " momentum wd"});
    cases.push_back({OpKind::SgdUpdate, SgdAttrs{n, 0.05f, 0.8f, 0.f, true}, d + " nesterov"});
    cases.push_back({OpKind::AdamUpdate, AdamAttrs{n, 1e-3f, 0.9f, 0.999f, 1e-7f, 0.f, 1}, d + " step 1",
                     [](std::vector<Vec>&, std::vector<Vec>& out, std::mt19937&) {
                       std::fill(out[1].begin(), out[1].end(), 0.f);
                       std::fill(out[2].begin(), out[2].end(), 0.f);
                     }});
    cases.push_back(
        {OpKind::AdamUpdate, AdamAttrs{n, 1e-2f, 0.8f, 0.99f, 1e-3f, 0.1f, 17}, d + " step 17 wd", positive_state});
    cases.push_back({OpKind::RmspropUpdate, RmspropAttrs{n, 1e-2f, 0.9f, 1e-3f, 0.f}, d, positive_sq});
    cases.push_back({OpKind::RmspropUpdate, RmspropAttrs{n, 1e-2f, 0.9f, 1e-3f, 0.5f}, d + " momentum", positive_sq});
    cases.push_back({OpKind::EmaUpdate, EmaAttrs{n, 0.99f}, d});
  }
  run_table(cases);
}
