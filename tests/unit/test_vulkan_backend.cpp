// The Vulkan backend on the machine's Vulkan devices (lavapipe in CI), with the validation layer on:
// enumeration, memory limits, batching, the pipeline cache, unaligned views, errors, and the validation
// message counter the conformance suite relies on.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/conformance.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"
#include "kiln/single_runner.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

struct Vk {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> device;
  std::unique_ptr<Allocator> alloc;
  explicit operator bool() const { return device != nullptr; }
  uint64_t counter(const char* name) { return *static_cast<const uint64_t*>(device->extension(name)); }
  uint64_t validation_messages() {
    return static_cast<std::atomic<uint64_t>*>(device->extension(kValidationMessagesExtension))->load();
  }
};

// The first Vulkan device with validation on, or an empty Vk where there is none; then the test case is marked
// skipped (test::skip) and must return.
Vk open_vulkan(bool validation = true) {
  Vk v;
  if (!test::registry().has_backend("vulkan")) {
    test::skip("the vulkan backend is not built in this tree");
    return v;
  }
  v.backend = test::registry().backend("vulkan")(BackendOptions::parse(validation ? "validation = true" : ""));
  if (v.backend->enumerate().empty()) {
    test::skip("no Vulkan device: " + v.backend->unavailable_reason());
    return v;
  }
  v.device = v.backend->open(0);
  v.alloc = std::make_unique<Allocator>(*v.device, AllocatorOptions{});
  return v;
}

std::vector<float> download(Device& d, const BufferView& v) {
  std::vector<float> out(v.bytes / 4);
  d.copy_to_host(v, out.data());
  return out;
}

OpCall fill(const BufferView& y, int64_t count, float value) {
  return OpCall{OpKind::Fill, ElementwiseAttrs{count, value}, {}, {y}, {}};
}

}  // namespace

TEST_CASE("vulkan enumerates each device with a name, a hardware id and its memory", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  const auto devices = v.backend->enumerate();
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& d = devices[i];
    CHECK(d.backend == "vulkan");
    CHECK(d.index == static_cast<int>(i));
    CHECK_FALSE(d.name.empty());
    // PCI bus id "dddd:bb:dd.f" where the driver reports it, else the device UUID.
    const bool pci = d.hardware_id.size() == 12 && d.hardware_id[4] == ':' && d.hardware_id[10] == '.';
    CHECK((pci || d.hardware_id.rfind("uuid:", 0) == 0));
    CHECK(d.total_memory > 0);
    CHECK(d.free_memory <= d.total_memory);
    CHECK_FALSE(d.host_addressable);  // VkBuffers, reached through staging copies
    if (d.name.find("llvmpipe") != std::string::npos) CHECK(d.type == DeviceType::cpu);  // lavapipe says it is a CPU
  }
  CHECK(v.device->info().label() == "vulkan:0");
  const std::string vendor = static_cast<const char*>(v.device->extension("vulkan.vendor"));
  CHECK_FALSE(vendor.empty());
  const std::string describe = static_cast<const char*>(v.device->extension("vulkan.describe"));
  CHECK_THAT(describe, Catch::Contains("vendor: " + vendor) && Catch::Contains("device-local") &&
                           Catch::Contains("maxStorageBufferRange: ") && Catch::Contains("VK_EXT_memory_budget: "));
  CHECK_THROWS_WITH(v.backend->open(99), Catch::Contains("no device 99") && Catch::Contains("vulkan:0"));
}

TEST_CASE("vulkan refuses blocks above the driver's limits with nullptr and stays usable", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  CHECK(v.device->allocate_block(size_t(1) << 62) == nullptr);
  CHECK(v.device->allocate_block(v.device->info().total_memory + 1) == nullptr);
  Block* b = v.device->allocate_block(4096);
  REQUIRE(b != nullptr);
  CHECK(v.device->query_free_memory() <= v.device->info().total_memory - 4096);
  BufferView view{b, 0, 4096};
  v.device->run(fill(view, 1024, 7.f));
  CHECK(download(*v.device, view) == std::vector<float>(1024, 7.f));
  v.device->free_block(b);
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan records ops into batches and a sequence into one submission", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  Allocation a = v.alloc->allocate(4096, {});
  v.device->run(fill(a.view(), 1024, 0.f));
  v.device->synchronize();
  const uint64_t before = v.counter("vulkan.submissions");
  for (int i = 1; i <= 100; ++i) v.device->run(fill(a.view(), 1024, float(i)));
  v.device->synchronize();
  CHECK(v.counter("vulkan.submissions") - before == 1);  // 100 ops, one batch: no per-op submit or wait

  const uint64_t seq = v.counter("vulkan.submissions");
  v.device->begin_sequence(1);
  for (int i = 0; i < 600; ++i) v.device->run(fill(a.view(), 1024, float(i)));  // past the 256-op batch limit
  v.device->end_sequence();
  v.device->synchronize();
  CHECK(v.counter("vulkan.submissions") - seq == 1);
  CHECK(download(*v.device, a.view()) == std::vector<float>(1024, 599.f));  // the last write wins: barriers work
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan creates each pipeline once and reuses it", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  Allocation a = v.alloc->allocate(4096, {});
  v.device->run(fill(a.view(), 1024, 1.f));
  const uint64_t after_first = v.counter("vulkan.pipelines");
  for (int i = 0; i < 10; ++i) v.device->run(fill(a.view(), 1024, 2.f));
  v.device->synchronize();
  CHECK(after_first >= 1);
  CHECK(v.counter("vulkan.pipelines") == after_first);
}

TEST_CASE("vulkan runs ops on views not aligned to minStorageBufferOffsetAlignment", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  Allocation a = v.alloc->allocate(64 * 4, {});
  std::vector<float> host(64);
  for (int i = 0; i < 64; ++i) host[static_cast<size_t>(i)] = float(i);
  v.device->copy_from_host(host.data(), a.view());
  // x = elements 1..10, y = elements 13..22: offsets of 4 and 52 bytes.
  BufferView x{a.view().block, a.view().offset + 4, 40}, y{a.view().block, a.view().offset + 52, 40};
  v.device->run(OpCall{OpKind::Scale, ElementwiseAttrs{10, 3.f}, {x}, {y}, {}});
  const auto out = download(*v.device, a.view());
  for (int i = 0; i < 64; ++i) {
    const float want = (i >= 13 && i < 23) ? 3.f * float(i - 12) : float(i);
    INFO("element " << i);
    CHECK(out[static_cast<size_t>(i)] == want);
  }
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan rejects foreign buffers, wrong buffer counts and short views with DeviceError", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  Allocation a = v.alloc->allocate(4096, {});
  Block foreign{nullptr, nullptr, 4096, 12345};
  CHECK_THROWS_AS(v.device->run(fill(BufferView{&foreign, 0, 4096}, 1024, 1.f)), DeviceError);
  CHECK_THROWS_WITH(v.device->run(fill(BufferView{&foreign, 0, 4096}, 1024, 1.f)),
                    Catch::Contains("is not memory of vulkan:0"));
  // Counts and sizes are the op contract, checked once when a call is bound (check_call), not by the device.
  CHECK_THROWS_WITH(check_call(OpCall{OpKind::Add, ElementwiseAttrs{4}, {a.view()}, {a.view()}, {}}, "vulkan:0"),
                    Catch::Contains("op add: expected 2 inputs"));
  CHECK_THROWS_WITH(check_call(fill(a.view(), 2048, 1.f), "vulkan:0"), Catch::Contains("expected 8192 bytes"));
  CHECK_THROWS_WITH(v.device->copy_on_device(BufferView{a.view().block, a.view().offset, 64},
                                             BufferView{a.view().block, a.view().offset + 32, 64}),
                    Catch::Contains("overlap"));
}

TEST_CASE("vulkan explains what it cannot run instead of running it wrong", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  // A row is walked by one workgroup: past ~700,000 columns it would exceed llvmpipe's loop limit.
  const Support ce = v.device->supports(OpKind::SoftmaxCrossEntropy, LossAttrs{2, 2000000, 1.f, true});
  CHECK_FALSE(ce.yes);
  CHECK_THAT(ce.reason, Catch::Contains("cols = 2000000") && Catch::Contains("65535"));
  CHECK(v.device->supports(OpKind::SoftmaxCrossEntropy, LossAttrs{2, 100000, 1.f, true}).yes);
  PoolAttrs global;
  global.n = 1, global.c = 1, global.h = 256, global.w = 256, global.kh = 256, global.kw = 256;
  global.stride_h = 256, global.stride_w = 256, global.oh = 1, global.ow = 1;
  const Support gp = v.device->supports(OpKind::AvgPoolForward, global);
  CHECK_FALSE(gp.yes);
  CHECK_THAT(gp.reason, Catch::Contains("256x256 window") && Catch::Contains("loop iterations"));
  CHECK(v.device->supports(OpKind::Gemm, GemmAttrs{2, 3, 4000000}).yes);  // K of any length
  // The executor asks supports() before it binds a call; devices run only calls it accepted.
  const Support act = v.device->supports(OpKind::ActivationForward, ActivationAttrs{static_cast<Activation>(7), 4});
  CHECK_FALSE(act.yes);
  CHECK_THAT(act.reason, Catch::Contains("unknown activation 7"));
}

TEST_CASE("vulkan conv2d_backward_filter gives the reference result with and without its split-K workspace",
          "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  ConvAttrs a;
  a.n = 16, a.c = 3, a.h = 12, a.w = 12, a.k = 5, a.r = 3, a.s = 3, a.pad_h = 1, a.pad_w = 1, a.oh = 12, a.ow = 12;
  std::vector<float> x(16 * 3 * 144), dy(16 * 5 * 144), want(5 * 3 * 9);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7 % 5) - 2);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int(i * 3 % 7) - 3);
  const float* in[] = {x.data(), dy.data()};
  float* out[] = {want.data()};
  reference_op(OpKind::Conv2dBackwardFilter, a, in, out);
  Allocation xb = v.alloc->allocate(x.size() * 4, {}), dyb = v.alloc->allocate(dy.size() * 4, {}),
             dwb = v.alloc->allocate(want.size() * 4, {});
  v.device->copy_from_host(x.data(), xb.view());
  v.device->copy_from_host(dy.data(), dyb.view());
  OpCall call{OpKind::Conv2dBackwardFilter, a, {xb.view(), dyb.view()}, {dwb.view()}, {}};
  const size_t ws = v.device->workspace_bytes(call);
  CHECK(ws > 0);        // 2304 reduction steps over one output tile: split
  v.device->run(call);  // no workspace given: one pass
  CHECK(download(*v.device, dwb.view()) == want);
  Allocation wsb = v.alloc->allocate(ws, {});
  call.workspace = wsb.view();
  v.device->run(OpCall{OpKind::Fill, ElementwiseAttrs{int64_t(want.size()), -1.f}, {}, {dwb.view()}, {}});
  v.device->run(call);
  CHECK(download(*v.device, dwb.view()) == want);  // small integers: exact either way
  CHECK(v.validation_messages() == 0);
}

TEST_CASE("vulkan validation messages are counted, from the option or KILN_VULKAN_VALIDATION=1", "[vulkan]") {
  {
    Vk v = open_vulkan(/*validation=*/true);
    if (!v) return;
    CHECK(v.validation_messages() == 0);
    REQUIRE(v.device->extension("vulkan.debug.submit_test_message") != nullptr);
    CHECK(v.validation_messages() == 1);
  }
  {
    Vk off = open_vulkan(/*validation=*/false);
    CHECK(off.device->extension("vulkan.debug.submit_test_message") == nullptr);
  }
  ::setenv("KILN_VULKAN_VALIDATION", "1", 1);
  Vk env = open_vulkan(/*validation=*/false);
  ::unsetenv("KILN_VULKAN_VALIDATION");
  REQUIRE(env.device->extension("vulkan.debug.submit_test_message") != nullptr);
  CHECK(env.validation_messages() == 1);
}

// Found in use: a dense layer of 32000 units followed by a dense layer gave a step-0 loss off in the fourth digit:
// the second layer's GEMM walks K = 32000 in one invocation, past llvmpipe's 65535 loop iterations.
TEST_CASE("vulkan gives the CPU's step-0 loss for a 32000-unit dense layer followed by a dense layer", "[vulkan]") {
  {
    Vk probe = open_vulkan(false);
    if (!probe) return;  // skipped (open_vulkan recorded why)
  }
  const ModelSpec m = test::model_from(R"(
[model]
input_shape = [1, 4, 4]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 32000
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
)",
                                       11);
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 0.01;
  const Element batch = test::random_batch(8, m.input_shape, 10, 3);
  auto step0 = [&](const char* backend, bool validation, uint64_t* messages) {
    auto be = test::registry().backend(backend)(BackendOptions::parse(validation ? "validation = true" : ""));
    auto dev = be->open(0);
    Allocator alloc(*dev, AllocatorOptions{});
    RunnerContext ctx;
    ctx.model = &m;
    ctx.optimizer = &sgd;
    ctx.devices = {DeviceContext{dev.get(), &alloc}};
    ctx.global_batch = 8;
    ctx.seed = 9;
    float loss = 0.f;
    {
      SingleDeviceRunner r(ctx, 0);
      r.prepare(8);
      loss = r.train_step(batch, {0, 0.01f}).total_loss;
    }
    if (messages) *messages = static_cast<std::atomic<uint64_t>*>(dev->extension(kValidationMessagesExtension))->load();
    return loss;
  };
  const float cpu = step0("cpu", false, nullptr);
  uint64_t messages = 0;
  const float vk = step0("vulkan", true, &messages);
  INFO("cpu " << cpu << ", vulkan " << vk);
  CHECK(std::isfinite(cpu));
  CHECK(std::abs(vk - cpu) <= 1e-5f * std::abs(cpu));
  CHECK(messages == 0);
}

// The GEMM has two kernels on llvmpipe: gemm_lvp_*.comp (vec4 loads, subgroup broadcasts, no shared memory) where
// each operand's contiguous dimension is a multiple of 4 and its view is 16-byte aligned, and the shared-memory
// tile otherwise (and everywhere with KILN_VULKAN_LVP_GEMM=0). Both must give the reference result, exactly for
// small integers, on every transpose, on edge tiles, on K past llvmpipe's loop limit (30004, and 70001, odd, which
// only the A^T B form accepts with vec4 loads), with alpha/beta, batched, and on an unaligned view.
TEST_CASE("vulkan gemm and batched_gemm give the reference result on both llvmpipe kernels", "[vulkan]") {
  struct S {
    int64_t batch, m, n, k;
    bool ta, tb;
    float alpha, beta;
  };
  std::vector<S> shapes;
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 2, tb = tr & 1;
    shapes.push_back({1, 64, 64, 64, ta, tb, 1.f, 0.f});
    shapes.push_back({1, 68, 36, 44, ta, tb, 1.f, 0.f});     // edge tiles in both directions
    shapes.push_back({1, 132, 100, 12, ta, tb, 2.f, -1.f});  // alpha, beta
    shapes.push_back({1, 4, 8, 30004, ta, tb, 1.f, 0.f});    // past 65535 loop iterations at one per K step
    shapes.push_back({3, 20, 16, 12, ta, tb, 1.f, 0.f});     // batched
    shapes.push_back({1, 17, 12, 8, ta, tb, 1.f, 0.f});      // M = 17: the vec4 kernel only without A^T
  }
  shapes.push_back({1, 8, 12, 70001, true, false, 1.f, 0.f});  // A^T B: K need not be a multiple of 4
  for (const char* lvp : {"1", "0"}) {
    ::setenv("KILN_VULKAN_LVP_GEMM", lvp, 1);
    Vk v = open_vulkan();
    ::unsetenv("KILN_VULKAN_LVP_GEMM");
    if (!v) return;
    const std::string desc = static_cast<const char*>(v.device->extension("vulkan.describe"));
    if (v.device->info().name.find("llvmpipe") != std::string::npos) {
      CHECK(desc.find("llvmpipe GEMM kernel: yes") != std::string::npos);
      CHECK(desc.find(std::string("llvmpipe GEMM kernel in use: ") + (lvp[0] == '1' ? "yes" : "no")) !=
            std::string::npos);
    }
    for (const S& s : shapes)
      for (size_t shift : {size_t(0), size_t(4)}) {  // a view 4 bytes past an aligned offset: the tile
        INFO("lvp " << lvp << " batch " << s.batch << " " << s.m << "x" << s.n << "x" << s.k << " ta " << s.ta << " tb "
                    << s.tb << " shift " << shift);
        const GemmAttrs a{s.m, s.n, s.k, s.ta, s.tb, s.alpha, s.beta, s.batch};
        const OpKind kind = s.batch > 1 ? OpKind::BatchedGemm : OpKind::Gemm;
        std::vector<float> x(s.batch * s.m * s.k), w(s.batch * s.k * s.n), y(s.batch * s.m * s.n), want;
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7 % 5) - 2);
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i * 3 % 7) - 3);
        for (size_t i = 0; i < y.size(); ++i) y[i] = float(int(i % 3) - 1);
        want = y;
        const float* in[] = {x.data(), w.data()};
        float* out[] = {want.data()};
        reference_op(kind, a, in, out);
        Allocation xb = v.alloc->allocate(x.size() * 4 + 16, {}), wb = v.alloc->allocate(w.size() * 4 + 16, {}),
                   yb = v.alloc->allocate(y.size() * 4 + 16, {});
        BufferView xv = xb.view(), wv = wb.view(), yv = yb.view();
        xv.offset += shift, wv.offset += shift, yv.offset += shift;
        xv.bytes = x.size() * 4, wv.bytes = w.size() * 4, yv.bytes = y.size() * 4;
        v.device->copy_from_host(x.data(), xv);
        v.device->copy_from_host(w.data(), wv);
        v.device->copy_from_host(y.data(), yv);
        v.device->run(OpCall{kind, a, {xv, wv}, {yv}, {}});
        CHECK(download(*v.device, yv) == want);  // small integers: exact in any summation order
      }
    CHECK(v.validation_messages() == 0);
  }
}

// On llvmpipe the convolutions, given their workspace, run on gemm_lvp around the patch matrix of a chunk of
// images: forward = filters * patches (conv_im2col), backward data = filters^T * dy folded back (conv_col2im,
// stride 1), filter gradient = dy * patches^T summed over the images; without the workspace, or where c*r*s or
// oh*ow is not a multiple of 4, the implicit-GEMM tile. Every path against the reference, exactly (small integers).
TEST_CASE("vulkan convolutions give the reference result through im2col + gemm_lvp and the tile", "[vulkan]") {
  Vk v = open_vulkan();
  if (!v) return;
  const bool lvp = std::string(static_cast<const char*>(v.device->extension("vulkan.describe")))
                       .find("llvmpipe GEMM kernel in use: yes") != std::string::npos;
  struct S {
    int64_t n, c, h, w, k, r, s, sh, pad;
  };
  const S shapes[] = {{3, 4, 10, 10, 5, 3, 3, 1, 1},   // c*r*s = 36, oh*ow = 100
                      {2, 4, 16, 16, 7, 3, 3, 2, 1},   // stride 2: oh*ow = 64
                      {2, 4, 12, 12, 3, 4, 4, 2, 1},   // even filter, stride 2: taps that skip rows
                      {2, 64, 64, 64, 3, 3, 3, 1, 1},  // 9.4 MB of patches per image: one image per chunk
                      {2, 3, 8, 8, 4, 3, 3, 1, 1},     // c*r*s = 27: the tile
                      {1, 4, 5, 5, 6, 1, 1, 1, 0}};    // oh*ow = 25: the tile
  for (const S& s : shapes)
    for (OpKind kind : {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
      ConvAttrs a;
      a.n = s.n, a.c = s.c, a.h = s.h, a.w = s.w, a.k = s.k, a.r = s.r, a.s = s.s, a.stride_h = s.sh;
      a.stride_w = s.sh, a.pad_h = s.pad, a.pad_w = s.pad;
      a.oh = (s.h + 2 * s.pad - s.r) / s.sh + 1, a.ow = (s.w + 2 * s.pad - s.s) / s.sh + 1;
      INFO("kind " << int(kind) << " n " << a.n << " c " << a.c << " h " << a.h << " k " << a.k << " r " << a.r
                   << " stride " << s.sh);
      const int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
      std::vector<int64_t> sizes_in, sizes_out;
      if (kind == OpKind::Conv2dForward)
        sizes_in = {nx, nw}, sizes_out = {ny};
      else if (kind == OpKind::Conv2dBackwardData)
        sizes_in = {ny, nw}, sizes_out = {nx};
      else
        sizes_in = {nx, ny}, sizes_out = {nw};
      std::vector<std::vector<float>> in(2);
      for (int t = 0; t < 2; ++t) {
        in[t].resize(sizes_in[t]);
        for (size_t i = 0; i < in[t].size(); ++i) in[t][i] = float(int(i * (t ? 3 : 7) % (t ? 7 : 5)) - (t ? 3 : 2));
      }
      std::vector<float> want(sizes_out[0]);
      const float* inp[] = {in[0].data(), in[1].data()};
      float* out[] = {want.data()};
      reference_op(kind, a, inp, out);
      Allocation b0 = v.alloc->allocate(in[0].size() * 4, {}), b1 = v.alloc->allocate(in[1].size() * 4, {}),
                 yb = v.alloc->allocate(want.size() * 4, {});
      v.device->copy_from_host(in[0].data(), b0.view());
      v.device->copy_from_host(in[1].data(), b1.view());
      OpCall call{kind, a, {b0.view(), b1.view()}, {yb.view()}, {}};
      v.device->run(call);  // no workspace: the tile
      CHECK(download(*v.device, yb.view()) == want);
      const size_t ws = v.device->workspace_bytes(call);
      const bool fits = lvp && (a.c * a.r * a.s) % 4 == 0 && (a.oh * a.ow) % 4 == 0 &&
                        (kind != OpKind::Conv2dBackwardData || s.sh == 1);  // conv_col2im: stride 1
      if (kind != OpKind::Conv2dBackwardFilter)  // (the tiled filter gradient asks for split-K scratch too)
        CHECK((ws > 0) == fits);
      if (ws > 0) {
        Allocation wsb = v.alloc->allocate(ws, {});
        call.workspace = wsb.view();
        v.device->run(fill(yb.view(), int64_t(want.size()), -1.f));
        v.device->run(call);
        CHECK(download(*v.device, yb.view()) == want);
      }
    }
  CHECK(v.validation_messages() == 0);
}
