// The cpu backend's native bf16 kernels of the convolution side (convolutions through oneDNN, pooling, batch norm):
// each op run on bf16 buffers against kiln::reference_op on the same bf16 values widened to float32.
//
// Tolerance: the inputs are bf16 values, which the reference reads exactly, so the only differences are (a) the
// kernel's float32 accumulation order against the reference's (double where it matters): a few float32 ulps of the
// sum of |terms|, far below (b) the one rounding of each output to bf16 (8 significant bits: relative error at most
// 2^-9, half a bf16 ulp; we allow 2^-8). So each bf16 output must be within 2^-8 |ref| + 1e-4 max|ref| of the
// reference: the second term covers outputs near zero where float32 cancellation dominates. Float32 outputs (a
// parameter's gradient, statistics) are held to 1e-5 relative plus 1e-5 max|ref|. Reading bf16 bytes as float32, or
// writing float32 where bf16 is expected, gives values off by orders of magnitude (or pairs of bf16 read as one
// float), far outside these bounds.
//
// Each call with bf16 outputs also asserts that the kernel takes the bf16 buffers natively: its workspace is smaller
// than the float32 copies the backend would otherwise make of its 16-bit buffers (dispatch.cpp converts a call its
// kernel declines into float32 copies in the workspace, so a converted call needs at least those bytes). The shapes
// are large enough for oneDNN's per-thread blocked copies (bf16, a slice of the batch each) and scratchpads to
// weigh less than those copies; a float32 output's blocked copy is float32 too, so calls with one are not asked.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

struct Cpu {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
  explicit Cpu(int threads) {
    backend = test::registry().backend("cpu")(BackendOptions::parse("threads = " + std::to_string(threads)));
    device = backend->open(0);
  }
};

// One buffer of a call: its values (float32, bf16-rounded where the buffer is bf16) and its device view.
struct Buf {
  DType t = DType::f32;
  Vec v;
  Block* block = nullptr;
  BufferView view;
};

class Call {
 public:
  Call(Device& d, OpKind kind, OpAttrs attrs) : d_(d), kind_(kind), attrs_(std::move(attrs)) {
    const auto ar = op_arity(kind_, attrs_);
    in_.resize(ar.in.size());
    out_.resize(ar.out.size());
    for (size_t i = 0; i < ar.in.size(); ++i) in_[i].v.resize(static_cast<size_t>(ar.in[i]));
    for (size_t i = 0; i < ar.out.size(); ++i) out_[i].v.resize(static_cast<size_t>(ar.out[i]));
  }
  ~Call() {
    for (auto* list : {&in_, &out_})
      for (auto& b : *list) d_.free_block(b.block);
    d_.free_block(ws_);
  }
  Buf& in(size_t i) { return in_[i]; }
  Buf& out(size_t i) { return out_[i]; }

  // Random inputs in [lo, hi) (rounded to bf16 where the buffer is bf16), outputs' initial values too (read-write
  // outputs: the running statistics).
  void fill(std::mt19937& g, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (auto* list : {&in_, &out_})
      for (auto& b : *list)
        for (auto& x : b.v) x = round_to(u(g), b.t);
  }

  // Runs the op on the device; returns the workspace it asked for.
  size_t run() {
    for (auto* list : {&in_, &out_})
      for (auto& b : *list) upload(b);
    return run_only(true);
  }
  // Runs it again on the buffers as they are (the first call uploads nothing: run() does).
  size_t run_only(bool download_outputs = false) {
    if (!in_.empty() && !in_[0].block)
      for (auto* list : {&in_, &out_})
        for (auto& b : *list) upload(b);
    OpCall c{kind_, attrs_, {}, {}, {}};
    for (auto& b : in_) c.in.push_back(b.view);
    for (auto& b : out_) c.out.push_back(b.view);
    const size_t ws = d_.workspace_bytes(c);
    if (ws) {
      if (!ws_) ws_ = d_.allocate_block(ws);
      REQUIRE(ws_ != nullptr);
      c.workspace = BufferView{ws_, 0, ws};
    }
    d_.run(c);
    if (download_outputs)
      for (auto& b : out_) b.v = download(b);
    return ws;
  }
  // The reference on the inputs' values (the outputs' initial values for the read-write ones).
  std::vector<Vec> reference(const std::vector<Vec>& out_init) const {
    std::vector<Vec> r = out_init;
    std::vector<const float*> ip;
    std::vector<float*> op;
    for (const auto& b : in_) ip.push_back(b.v.data());
    for (auto& v : r) op.push_back(v.data());
    reference_op(kind_, attrs_, ip, op);
    return r;
  }
  // Bytes of float32 copies of every 16-bit buffer: what a converted call's workspace holds at least.
  size_t converted_bytes() const {
    size_t s = 0;
    for (const auto* list : {&in_, &out_})
      for (const auto& b : *list)
        if (b.t != DType::f32) s += b.v.size() * sizeof(float);
    return s;
  }

 private:
  void upload(Buf& b) {
    const size_t bytes = storage_bytes(static_cast<int64_t>(b.v.size()), b.t);
    b.block = d_.allocate_block(bytes + 64);
    REQUIRE(b.block != nullptr);
    b.view = BufferView{b.block, 32, bytes, b.t};  // a non-zero offset
    std::vector<char> host(bytes, 0);
    if (b.t == DType::f32)
      std::memcpy(host.data(), b.v.data(), bytes);
    else
      for (size_t i = 0; i < b.v.size(); ++i) {
        const uint16_t h = float_to_bf16(b.v[i]);
        std::memcpy(host.data() + 2 * i, &h, 2);
      }
    d_.copy_from_host(host.data(), b.view);
  }
  Vec download(const Buf& b) {
    std::vector<char> host(b.view.bytes);
    d_.copy_to_host(b.view, host.data());
    Vec v(b.v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (b.t == DType::f32) {
        std::memcpy(&v[i], host.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, host.data() + 2 * i, 2);
        v[i] = bf16_to_float(h);
      }
    }
    return v;
  }

  Device& d_;
  OpKind kind_;
  OpAttrs attrs_;
  std::vector<Buf> in_, out_;
  Block* ws_ = nullptr;
};

// Checks got against ref with the bounds at the top of the file; returns the worst error in units of the bound.
double check_close(const Vec& got, const Vec& ref, DType t, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  double scale = 0;
  for (float r : ref) scale = std::max(scale, std::abs(double(r)));
  const double rel = t == DType::f32 ? 1e-5 : std::ldexp(1.0, -8), abs_part = (t == DType::f32 ? 1e-5 : 1e-4) * scale;
  double worst = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = rel * std::abs(double(ref[i])) + abs_part + 1e-30;
    const double e = std::abs(double(got[i]) - double(ref[i])) / bound;
    if (!(e <= 1.0)) {
      if (bad++ == 0) first_bad = i;
    }
    if (!(e <= worst)) worst = e;
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside the bound; first at " << first_bad << ": got "
            << (bad ? got[first_bad] : 0.f) << ", reference " << (bad ? ref[first_bad] : 0.f));
  CHECK(bad == 0);
  return worst;
}

// Runs one op with the given storage types (inputs, outputs) and checks every output and the native path.
void check_op(Device& d, OpKind kind, const OpAttrs& attrs, const std::vector<DType>& in_t,
              const std::vector<DType>& out_t, const std::string& name, float lo = -1.f, float hi = 1.f,
              bool check_native = true, uint32_t seed = 7) {
  INFO(name);
  Call c(d, kind, attrs);
  for (size_t i = 0; i < in_t.size(); ++i) c.in(i).t = in_t[i];
  for (size_t i = 0; i < out_t.size(); ++i) c.out(i).t = out_t[i];
  std::mt19937 g(seed);
  c.fill(g, lo, hi);
  if (kind == OpKind::BatchNormForward || kind == OpKind::BatchNormBackward) {
    // gamma around 1, rstd and running variance positive, as a trained layer has them.
    std::uniform_real_distribution<float> pos(0.5f, 1.5f);
    for (auto& x : c.in(1).v) x = pos(g);
    if (kind == OpKind::BatchNormForward)
      for (auto& x : c.out(4).v) x = pos(g);
    else
      for (auto& x : c.in(3).v) x = pos(g);
  }
  if (kind == OpKind::MaxPoolBackward) {  // y: the forward pass's maxima, so that argmaxes exist
    Vec y(c.in(1).v.size());
    float* yp = y.data();
    const float* xp = c.in(0).v.data();
    reference_op(OpKind::MaxPoolForward, attrs, std::span<const float* const>(&xp, 1), std::span<float* const>(&yp, 1));
    c.in(1).v = y;  // maxima of bf16 values are bf16 values
  }
  std::vector<Vec> init;
  for (size_t i = 0; i < out_t.size(); ++i) init.push_back(c.out(i).v);
  const auto ref = c.reference(init);
  const size_t ws = c.run();
  for (size_t i = 0; i < out_t.size(); ++i)
    check_close(c.out(i).v, ref[i], out_t[i], name + " output " + std::to_string(i));
  if (check_native) {
    INFO("workspace " << ws << " bytes, float32 copies " << c.converted_bytes() << " bytes");
    CHECK(ws < c.converted_bytes());  // the kernel reads and writes bf16 itself
  }
}

constexpr DType B = DType::bf16, F = DType::f32;

}  // namespace

TEST_CASE("cpu convolutions on bf16 storage match the reference within a bf16 rounding", "[cpu][bf16]") {
  Cpu cpu(2);
  Device& d = *cpu.device;
  struct G {
    const char* name;
    ConvAttrs a;
  };
  // 3x3 "same" (a CNN's second layer), one input channel (its first), strided 3x3 and a 1x1 stride-2 shortcut (a
  // ResNet's downsampling); odd batches give the pool's two threads slices of unequal sizes.
  const G geoms[] = {
      {"33x8x10x10.k16.r3.p1", ConvAttrs{33, 8, 10, 10, 16, 3, 3, 1, 1, 1, 1, 10, 10}},
      {"33x1x12x12.k16.r3.p1", ConvAttrs{33, 1, 12, 12, 16, 3, 3, 1, 1, 1, 1, 12, 12}},
      {"32x16x9x9.k32.r3.s2.p1", ConvAttrs{32, 16, 9, 9, 32, 3, 3, 2, 2, 1, 1, 5, 5}},
      {"31x16x8x8.k32.pointwise.s2", ConvAttrs{31, 16, 8, 8, 32, 1, 1, 2, 2, 0, 0, 4, 4}},
  };
  // Without oneDNN the backend converts a bf16 convolution to float32 (there is no bf16 im2col path): the values
  // are checked, the native path is not there to check.
#ifdef KILN_CPU_HAS_DNNL
  const char* off = std::getenv("KILN_CPU_DNNL");  // KILN_CPU_DNNL=0 turns oneDNN off
  const bool native = !(off && std::string(off) == "0");
#else
  const bool native = false;
#endif
  for (const auto& geo : geoms) {
    const std::string n = geo.name;
    check_op(d, OpKind::Conv2dForward, geo.a, {B, B}, {B}, n + " forward", -1.f, 1.f, native);
    check_op(d, OpKind::Conv2dForward, geo.a, {B, B}, {F}, n + " forward, float32 y", -1.f, 1.f, false);
    check_op(d, OpKind::Conv2dBackwardData, geo.a, {B, B}, {B}, n + " backward data", -1.f, 1.f, native);
    // dw is small beside x and dy: the filter's per-thread partials are float32 whatever dw's type.
    check_op(d, OpKind::Conv2dBackwardFilter, geo.a, {B, B}, {B}, n + " backward filter", -1.f, 1.f, native);
    check_op(d, OpKind::Conv2dBackwardFilter, geo.a, {B, B}, {F}, n + " backward filter, float32 dw", -1.f, 1.f, false);
  }
}

TEST_CASE("cpu pooling on bf16 storage matches the reference", "[cpu][bf16]") {
  Cpu cpu(2);
  Device& d = *cpu.device;
  // 2x2 stride 2 (the fast path) on odd and even planes, and a padded 3x3 stride-1 window (the general loops). Planes
  // of fewer than 8 outputs, and rows of an odd and an even count, take the partial loads and stores at a plane's end.
  const PoolAttrs pools[] = {
      PoolAttrs{9, 16, 14, 14, 2, 2, 2, 2, 0, 0, 7, 7}, PoolAttrs{7, 12, 9, 11, 2, 2, 2, 2, 0, 0, 4, 5},
      PoolAttrs{3, 5, 6, 6, 2, 2, 2, 2, 0, 0, 3, 3},    PoolAttrs{5, 3, 3, 15, 2, 2, 2, 2, 0, 0, 1, 7},
      PoolAttrs{4, 3, 2, 12, 2, 2, 2, 2, 0, 0, 1, 6},   PoolAttrs{7, 12, 7, 7, 3, 3, 1, 1, 1, 1, 7, 7}};
  for (const auto& a : pools) {
    const std::string n = std::to_string(a.h) + "x" + std::to_string(a.w) + " k" + std::to_string(a.kh);
    check_op(d, OpKind::MaxPoolForward, a, {B}, {B}, n + " max forward");
    check_op(d, OpKind::MaxPoolBackward, a, {B, B, B}, {B}, n + " max backward");
    check_op(d, OpKind::AvgPoolForward, a, {B}, {B}, n + " avg forward");
    check_op(d, OpKind::AvgPoolBackward, a, {B}, {B}, n + " avg backward");
  }
}

TEST_CASE("cpu batch norm on bf16 activations matches the reference, statistics in float32", "[cpu][bf16]") {
  Cpu cpu(2);
  Device& d = *cpu.device;
  // Long runs (inner 36) and short ones (inner 4, rank-2-like), training and evaluation. Inputs offset from 0 so
  // that the mean matters.
  for (int64_t inner : {36, 4})
    for (bool training : {true, false}) {
      BatchNormAttrs a;
      a.n = 7, a.c = 5, a.inner = inner, a.training = training;
      const std::string n = "inner " + std::to_string(inner) + (training ? " training" : " evaluation");
      // in: x, gamma, beta; out: y, mean, rstd, running_mean, running_var
      check_op(d, OpKind::BatchNormForward, a, {B, F, F}, {B, F, F, F, F}, n + " forward", 0.5f, 2.5f);
      // in: x, gamma, mean, rstd, dy; out: dx, dgamma, dbeta
      check_op(d, OpKind::BatchNormBackward, a, {B, F, F, F, B}, {B, F, F}, n + " backward", -1.f, 1.f);
    }
}

// Not a check: f32 against bf16 timings of the ops above at the CNN (batch 256) and ResNet (batch 128) samples'
// shapes, best and median of interleaved runs (this host has slow phases; the best is the least disturbed).
//   build/bin/kiln_unit_tests "[.bf16_speed]"
TEST_CASE("cpu bf16 against float32 speed of the convolution side's ops", "[.bf16_speed]") {
  Cpu cpu(2);
  Device& d = *cpu.device;
  struct Op {
    std::string name;
    OpKind kind;
    OpAttrs attrs;
  };
  auto bn = [](int64_t n, int64_t c, int64_t inner) {
    BatchNormAttrs a;
    a.n = n, a.c = c, a.inner = inner;
    return a;
  };
  const std::vector<Op> ops = {
      {"cnn conv1 fwd", OpKind::Conv2dForward, ConvAttrs{256, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 28, 28}},
      {"cnn conv1 bwd filter", OpKind::Conv2dBackwardFilter, ConvAttrs{256, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 28, 28}},
      {"cnn conv2 fwd", OpKind::Conv2dForward, ConvAttrs{256, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14}},
      {"cnn conv2 bwd data", OpKind::Conv2dBackwardData, ConvAttrs{256, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14}},
      {"cnn conv2 bwd filter", OpKind::Conv2dBackwardFilter, ConvAttrs{256, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 14, 14}},
      {"cnn pool1 fwd", OpKind::MaxPoolForward, PoolAttrs{256, 32, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14}},
      {"cnn pool1 bwd", OpKind::MaxPoolBackward, PoolAttrs{256, 32, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14}},
      {"resnet 16ch fwd", OpKind::Conv2dForward, ConvAttrs{128, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 28, 28}},
      {"resnet 16ch bwd data", OpKind::Conv2dBackwardData, ConvAttrs{128, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 28, 28}},
      {"resnet 16ch bwd filter", OpKind::Conv2dBackwardFilter,
       ConvAttrs{128, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 28, 28}},
      {"resnet bn 16ch fwd", OpKind::BatchNormForward, bn(128, 16, 784)},
      {"resnet bn 16ch bwd", OpKind::BatchNormBackward, bn(128, 16, 784)},
  };
  for (const auto& op : ops) {
    std::vector<double> t[2];
    const auto ar = op_arity(op.kind, op.attrs);
    std::vector<std::unique_ptr<Call>> calls;
    for (int ty = 0; ty < 2; ++ty) {
      calls.push_back(std::make_unique<Call>(d, op.kind, op.attrs));
      Call& c = *calls.back();
      const bool bnorm = op.kind == OpKind::BatchNormForward || op.kind == OpKind::BatchNormBackward;
      for (size_t i = 0; i < ar.in.size(); ++i) c.in(i).t = ty == 0 || (bnorm && i != 0 && i != 4) ? F : B;
      for (size_t i = 0; i < ar.out.size(); ++i) c.out(i).t = ty == 0 || (bnorm && i != 0) ? F : B;
      std::mt19937 g(1);
      c.fill(g, 0.5f, 1.5f);
    }
    for (int rep = 0; rep < 12; ++rep)
      for (int ty = 0; ty < 2; ++ty) {
        const auto t0 = std::chrono::steady_clock::now();
        calls[static_cast<size_t>(ty)]->run_only();
        t[ty].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    for (auto& v : t) std::sort(v.begin(), v.end());
    std::printf("%-26s f32 best %7.3f median %7.3f ms | bf16 best %7.3f median %7.3f ms | best ratio %.2fx\n",
                op.name.c_str(), t[0][0], t[0][t[0].size() / 2], t[1][0], t[1][t[1].size() / 2], t[0][0] / t[1][0]);
  }
}
