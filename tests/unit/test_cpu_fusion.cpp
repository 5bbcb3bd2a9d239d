// The CPU backend's fused runs (the kRunFused extension, backends/cpu/fusion.cpp): conv + bias [+ ReLU [+ max pool]],
// max-pool + ReLU backward + bias gradient with the backward convolution reading them, batch norm + ReLU: each equal
// to the same ops run one by one.
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_test_support.hpp"
#include "kiln/device.hpp"
#include "kiln/error.hpp"
#include "kiln/reference.hpp"
#include "test_support.hpp"

using namespace kiln;
using namespace kiln::test::cpu;

TEST_CASE("cpu fuses conv2d + in-place bias [+ relu] into one kernel that equals the ops run one by one",
          "[cpu][fusion]") {
  struct G {
    const char* name;
    ConvAttrs a;
  };
  const G geoms[] = {
      {"5x3x9x7.k6.r3.p1", ConvAttrs{5, 3, 9, 7, 6, 3, 3, 1, 1, 1, 1, 9, 7}},
      {"2x4x8x8.k5.r3.s2.valid", ConvAttrs{2, 4, 8, 8, 5, 3, 3, 2, 2, 0, 0, 3, 3}},
      {"3x6x5x5.k4.pointwise", ConvAttrs{3, 6, 5, 5, 4, 1, 1, 1, 1, 0, 0, 5, 5}},
      {"5x8x8x8.k12.r3.p1", ConvAttrs{5, 8, 8, 8, 12, 3, 3, 1, 1, 1, 1, 8, 8}},  // oneDNN's path, where built with it
      // oneDNN adds the bias and the output comes back 4 images (256 KiB) at a time, then one at a time: slices of
      // 11, 6 and 5, 4 and 4 and 3 images; the second takes Winograd where oneDNN has it.
      {"11x8x32x32.k16.r3.p1", ConvAttrs{11, 8, 32, 32, 16, 3, 3, 1, 1, 1, 1, 32, 32}},
      {"11x16x32x32.k16.r3.p1", ConvAttrs{11, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 32, 32}},
  };
  for (int threads : {1, 2, 3})
    for (const G& g : geoms)
      for (bool relu : {true, false}) {
        CAPTURE(threads, g.name, relu);
        auto cpu = open_cpu(threads);
        Device& d = *cpu.device;
        const ConvAttrs& a = g.a;
        const auto ar = op_arity(OpKind::Conv2dForward, a);
        const int64_t ny = ar.out[0];
        std::mt19937 gen(7);
        Vec x = random_vec(ar.in[0], gen), w = random_vec(ar.in[1], gen), b = random_vec(a.k, gen, -0.5f, 0.5f);
        Arena arena(d, {ar.in[0], ar.in[1], a.k, ny, ny});
        d.copy_from_host(x.data(), arena.view(0));
        d.copy_from_host(w.data(), arena.view(1));
        d.copy_from_host(b.data(), arena.view(2));
        const BufferView& y = arena.view(3);
        std::vector<OpCall> calls{{OpKind::Conv2dForward, a, {arena.view(0), arena.view(1)}, {y}, {}},
                                  {OpKind::BiasAdd, BiasAttrs{a.n, a.k, a.oh * a.ow}, {y, arena.view(2)}, {y}, {}}};
        if (relu) calls.push_back({OpKind::ActivationForward, ActivationAttrs{Activation::relu, ny}, {y}, {y}, {}});
        const size_t ws = d.workspace_bytes(calls[0]);
        Block* wb = ws ? d.allocate_block(ws) : nullptr;
        calls[0].workspace = BufferView{wb, 0, ws};

        for (const OpCall& c : calls) d.run(c);
        const Vec unfused = read(d, y);
        const Vec nan(static_cast<size_t>(ny), NAN);
        d.copy_from_host(nan.data(), y);
        CHECK(fused_runner(d).run_fused(calls) == calls.size());
        const Vec fused = read(d, y);
        CHECK(max_rel_diff(fused, unfused) < 1e-5);
        // The comparison has teeth: without the ReLU some outputs would be negative, and the bias is far above 1e-5.
        const auto negatives = std::count_if(fused.begin(), fused.end(), [](float v) { return v < 0.f; });
        if (relu)
          CHECK(negatives == 0);
        else
          CHECK(negatives > 0);
        // The planner's layout without [memory] inplace: the bias writes another buffer y1 and the ReLU writes
        // back over y0. Both must end as the unfused ops leave them.
        if (relu) {
          const BufferView& y1 = arena.view(4);
          std::vector<OpCall> pp = calls;
          pp[1].out[0] = y1;
          pp[2].in[0] = y1;
          for (const OpCall& c : pp) d.run(c);
          const Vec unfused_y0 = read(d, y), unfused_y1 = read(d, y1);
          d.copy_from_host(nan.data(), y);
          d.copy_from_host(nan.data(), y1);
          CHECK(fused_runner(d).run_fused(pp) == 3);
          CHECK(max_rel_diff(read(d, y), unfused_y0) < 1e-5);
          CHECK(max_rel_diff(read(d, y1), unfused_y1) < 1e-5);
          CHECK(read(d, y1) != read(d, y));  // y1 keeps its negatives

          // ... followed by a 2x2 max pool of y2 into its own buffer: four calls in one.
          PoolAttrs pa{a.n, a.k, a.oh, a.ow, 2, 2, 2, 2, 0, 0, a.oh / 2, a.ow / 2};
          const int64_t np = a.n * a.k * pa.oh * pa.ow;
          Arena pool_arena(d, {np});
          const BufferView& pout = pool_arena.view(0);
          pp.push_back({OpKind::MaxPoolForward, pa, {y}, {pout}, {}});
          for (const OpCall& c : pp) d.run(c);
          const Vec unfused_pool = read(d, pout);
          const Vec nan_pool(static_cast<size_t>(np), NAN);
          d.copy_from_host(nan.data(), y);
          d.copy_from_host(nan.data(), y1);
          d.copy_from_host(nan_pool.data(), pout);
          CHECK(fused_runner(d).run_fused(pp) == 4);
          CHECK(max_rel_diff(read(d, pout), unfused_pool) < 1e-5);
          CHECK(max_rel_diff(read(d, y), unfused_y0) < 1e-5);
          CHECK(max_rel_diff(read(d, y1), unfused_y1) < 1e-5);
          // A pool reading something other than the ReLU's output stays unfused (the first three still fuse).
          pp[3].in[0] = y1;
          CHECK(fused_runner(d).run_fused(pp) == 3);
        }

        // Not fused: a bias written to another buffer with nothing writing over y0, or a lone conv.
        OpCall bias_elsewhere = calls[1];
        bias_elsewhere.out[0] = arena.view(4);
        CHECK(fused_runner(d).run_fused(std::vector<OpCall>{calls[0], bias_elsewhere}) == 0);
        CHECK(fused_runner(d).run_fused(std::span<const OpCall>(calls).first(1)) == 0);
        if (wb) d.free_block(wb);
      }
}

TEST_CASE(
    "cpu fuses max-pool backward + in-place relu backward [+ bias gradient], equal bit for bit to the ops, ties "
    "at 0 included",
    "[cpu][fusion]") {
  struct G {
    const char* name;
    PoolAttrs a;
  };
  const G geoms[] = {
      {"3x4x7x9.k2.s2", PoolAttrs{3, 4, 7, 9, 2, 2, 2, 2, 0, 0, 3, 4}},      // the 2x2 fast path, odd edges
      {"2x3x7x9.k3.s2.p1", PoolAttrs{2, 3, 7, 9, 3, 3, 2, 2, 1, 1, 4, 5}},   // overlapping windows
      {"2x3x9x37.k2.s2", PoolAttrs{2, 3, 9, 37, 2, 2, 2, 2, 0, 0, 4, 18}},   // 8 windows at a time, and the rest
      {"3x5x14x14.k2.s2", PoolAttrs{3, 5, 14, 14, 2, 2, 2, 2, 0, 0, 7, 7}},  // rows of 7 windows (masked)
  };
  for (int threads : {1, 2})
    for (const G& g : geoms) {
      CAPTURE(threads, g.name);
      auto cpu = open_cpu(threads);
      Device& d = *cpu.device;
      const PoolAttrs& a = g.a;
      const int64_t nx = a.n * a.c * a.h * a.w, ny = a.n * a.c * a.oh * a.ow;
      std::mt19937 gen(3);
      std::uniform_int_distribution<int> small(-3, 2);  // after the ReLU about half the inputs tie at 0
      Vec x(static_cast<size_t>(nx));
      for (auto& v : x) v = std::max(0.f, static_cast<float>(small(gen)));
      Vec dy = random_vec(ny, gen);
      Arena arena(d, {nx, ny, ny, nx, nx, a.c, a.c});
      d.copy_from_host(x.data(), arena.view(0));
      d.copy_from_host(dy.data(), arena.view(2));
      d.run(OpCall{OpKind::MaxPoolForward, a, {arena.view(0)}, {arena.view(1)}, {}});
      const BufferView& dx = arena.view(3);
      const std::vector<OpCall> calls{
          {OpKind::MaxPoolBackward, a, {arena.view(0), arena.view(1), arena.view(2)}, {dx}, {}},
          {OpKind::ActivationBackward, ActivationAttrs{Activation::relu, nx}, {arena.view(0), dx}, {dx}, {}}};
      for (const OpCall& c : calls) d.run(c);
      const Vec unfused = read(d, dx);
      const Vec pool_only = [&] {
        d.run(calls[0]);
        return read(d, dx);
      }();
      const Vec nan(static_cast<size_t>(nx), NAN);
      d.copy_from_host(nan.data(), dx);
      CHECK(fused_runner(d).run_fused(calls) == 2);
      const Vec fused = read(d, dx);
      CHECK(std::memcmp(fused.data(), unfused.data(), fused.size() * sizeof(float)) == 0);
      CHECK(fused != pool_only);  // windows whose maximum is 0 pass gradient without the ReLU: the fusion matters

      // Not fused: the ReLU's y is not the pool's input.
      OpCall other_y = calls[1];
      other_y.in[0] = arena.view(4);
      CHECK(fused_runner(d).run_fused(std::vector<OpCall>{calls[0], other_y}) == 0);

      // With the conv layer's bias gradient of dx after them: dx and db as the three ops leave them.
      const OpCall bias{OpKind::BiasGrad, BiasAttrs{a.n, a.c, a.h * a.w}, {dx}, {arena.view(5)}, {}};
      d.run(calls[0]);
      d.run(calls[1]);
      d.run(bias);
      const Vec db_unfused = read(d, arena.view(5));
      const Vec nan_c(static_cast<size_t>(a.c), NAN);
      d.copy_from_host(nan.data(), dx);
      d.copy_from_host(nan_c.data(), arena.view(5));
      std::vector<OpCall> three = calls;
      three.push_back(bias);
      CHECK(fused_runner(d).run_fused(three) == 3);
      const Vec fused3 = read(d, dx), db_fused = read(d, arena.view(5));
      CHECK(std::memcmp(fused3.data(), unfused.data(), fused3.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(db_fused.data(), db_unfused.data(), db_fused.size() * sizeof(float)) == 0);
      CHECK(std::any_of(db_fused.begin(), db_fused.end(), [](float v) { return v != 0.f; }));
      // The bias gradient of another tensor, or written over dx: only the pool and the ReLU fuse.
      OpCall other_bias = bias;
      other_bias.in[0] = arena.view(4);
      three.back() = other_bias;
      CHECK(fused_runner(d).run_fused(three) == 2);
      OpCall over_dx = bias;
      over_dx.out[0] = BufferView{dx.block, dx.offset, static_cast<size_t>(a.c) * sizeof(float)};
      three.back() = over_dx;
      CHECK(fused_runner(d).run_fused(three) == 2);
    }
}

// The conv layer's backward after a pooled ReLU (fusion.cpp): max-pool backward, the ReLU's gradient and the bias
// gradient, then the backward convolution that reads their dx. Fused, each slice of the convolution's images
// gets its dx planes from the pool right before the convolution reads them. 13 images of 16 x 64 x 48 (192 KiB): 3
// or 4 slices on 1 and 2 threads, so slices of the pool and of the convolution interleave. Every buffer must end as
// the four ops run one by one leave it, bit for bit; with the convolution's output over the pool's input, or over
// its other input, only the first three fuse.
TEST_CASE("cpu fuses max-pool backward, relu, bias gradient and the backward convolution reading their dx, bit for bit",
          "[cpu][fusion]") {
  const ConvAttrs ca{13, 16, 64, 48, 16, 3, 3, 1, 1, 1, 1, 64, 48};
  const PoolAttrs pa{ca.n, ca.k, ca.oh, ca.ow, 2, 2, 2, 2, 0, 0, ca.oh / 2, ca.ow / 2};
  const int64_t nx = pa.n * pa.c * pa.h * pa.w, ny = pa.n * pa.c * pa.oh * pa.ow;
  for (int threads : {1, 2})
    for (OpKind kind : {OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter}) {
      const bool data = kind == OpKind::Conv2dBackwardData;
      CAPTURE(threads, std::string(op_name(kind)));
      auto cpu = open_cpu(threads);
      Device& d = *cpu.device;
      const auto ar = op_arity(kind, ca);
      const int64_t other_n = ar.in[data ? 1 : 0], out_n = ar.out[0];
      std::mt19937 gen(5);
      std::uniform_int_distribution<int> small(-3, 2);
      Vec px(static_cast<size_t>(nx));
      for (auto& v : px) v = std::max(0.f, static_cast<float>(small(gen)));  // a ReLU's output: ties at 0
      const Vec pdy = random_vec(ny, gen), other = random_vec(other_n, gen);
      // 0 pool x, 1 pool y, 2 pool dy, 3 dx, 4 db, 5 the convolution's other input, 6 its output
      Arena arena(d, {nx, ny, ny, nx, pa.c, other_n, out_n});
      auto v = [&](int i) { return arena.view(static_cast<size_t>(i)); };
      d.copy_from_host(px.data(), v(0));
      d.copy_from_host(pdy.data(), v(2));
      d.copy_from_host(other.data(), v(5));
      d.run(OpCall{OpKind::MaxPoolForward, pa, {v(0)}, {v(1)}, {}});
      OpCall conv{kind, ca, {data ? v(3) : v(5), data ? v(5) : v(3)}, {v(6)}, {}};
      const size_t ws = d.workspace_bytes(conv);
      Block* wb = ws ? d.allocate_block(ws) : nullptr;
      conv.workspace = BufferView{wb, 0, ws};
      const std::vector<OpCall> calls{
          {OpKind::MaxPoolBackward, pa, {v(0), v(1), v(2)}, {v(3)}, {}},
          {OpKind::ActivationBackward, ActivationAttrs{Activation::relu, nx}, {v(0), v(3)}, {v(3)}, {}},
          {OpKind::BiasGrad, BiasAttrs{pa.n, pa.c, pa.h * pa.w}, {v(3)}, {v(4)}, {}},
          conv};
      for (const OpCall& c : calls) d.run(c);
      const Vec dx = read(d, v(3)), db = read(d, v(4)), out = read(d, v(6));
      auto poison = [&] {
        for (int i : {3, 4, 6}) {
          const Vec nan(v(i).bytes / sizeof(float), NAN);
          d.copy_from_host(nan.data(), v(i));
        }
      };
      poison();
      CHECK(fused_runner(d).run_fused(calls) == 4);
      const Vec fdx = read(d, v(3)), fdb = read(d, v(4)), fout = read(d, v(6));
      CHECK(std::memcmp(fdx.data(), dx.data(), dx.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(fdb.data(), db.data(), db.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(fout.data(), out.data(), out.size() * sizeof(float)) == 0);
      CHECK(std::any_of(fout.begin(), fout.end(), [](float f) { return f != 0.f; }));

      // Not fused past the bias gradient: the convolution's output over the pool's input (slices would read it
      // after the convolution wrote it), or its other input over dx.
      std::vector<OpCall> over = calls;
      over[3].out[0] = BufferView{v(0).block, v(0).offset, v(6).bytes};
      CHECK(fused_runner(d).run_fused(over) == 3);
      over = calls;
      over[3].in[data ? 1 : 0] = BufferView{v(3).block, v(3).offset, v(5).bytes};
      CHECK(fused_runner(d).run_fused(over) == 3);
      if (wb) d.free_block(wb);
    }
}

// Backward data and backward filter of one convolution reading the same dy (fusion.cpp, dnnl_conv_backward_pair): one
// pass over the slices that reorders each slice's dy once for both, after the pool's backward (five calls) or alone
// (two calls), in backward filter's workspace (the planner's one workspace region: both calls' views start at the
// same place). dx, dw and the pool's outputs must be bit for bit the ops' own.
TEST_CASE(
    "cpu fuses backward data and backward filter of one convolution, after the pool's backward or alone, bit for "
    "bit",
    "[cpu][fusion]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev): no pair to fuse");
#else
  const ConvAttrs ca{13, 16, 64, 48, 16, 3, 3, 1, 1, 1, 1, 64, 48};
  const PoolAttrs pa{ca.n, ca.k, ca.oh, ca.ow, 2, 2, 2, 2, 0, 0, ca.oh / 2, ca.ow / 2};
  const int64_t nx = pa.n * pa.c * pa.h * pa.w, ny = pa.n * pa.c * pa.oh * pa.ow;
  const int64_t nw = ca.k * ca.c * ca.r * ca.s, ncx = ca.n * ca.c * ca.h * ca.w;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    auto cpu = open_cpu(threads);
    Device& d = *cpu.device;
    std::mt19937 gen(8);
    std::uniform_int_distribution<int> small(-3, 2);
    Vec px(static_cast<size_t>(nx));
    for (auto& v : px) v = std::max(0.f, static_cast<float>(small(gen)));
    const Vec pdy = random_vec(ny, gen), w = random_vec(nw, gen), cx = random_vec(ncx, gen);
    // 0 pool x, 1 pool y, 2 pool dy, 3 dx (the convolution's dy), 4 db, 5 w, 6 conv x, 7 conv dx, 8 dw
    Arena arena(d, {nx, ny, ny, nx, pa.c, nw, ncx, ncx, nw});
    auto v = [&](int i) { return arena.view(static_cast<size_t>(i)); };
    d.copy_from_host(px.data(), v(0));
    d.copy_from_host(pdy.data(), v(2));
    d.copy_from_host(w.data(), v(5));
    d.copy_from_host(cx.data(), v(6));
    d.run(OpCall{OpKind::MaxPoolForward, pa, {v(0)}, {v(1)}, {}});
    OpCall data{OpKind::Conv2dBackwardData, ca, {v(3), v(5)}, {v(7)}, {}};
    OpCall filter{OpKind::Conv2dBackwardFilter, ca, {v(6), v(3)}, {v(8)}, {}};
    const size_t ws = std::max(d.workspace_bytes(data), d.workspace_bytes(filter));
    Block* wb = d.allocate_block(ws);
    REQUIRE(wb);
    data.workspace = BufferView{wb, 0, d.workspace_bytes(data)};
    filter.workspace = BufferView{wb, 0, d.workspace_bytes(filter)};
    const std::vector<OpCall> calls{
        {OpKind::MaxPoolBackward, pa, {v(0), v(1), v(2)}, {v(3)}, {}},
        {OpKind::ActivationBackward, ActivationAttrs{Activation::relu, nx}, {v(0), v(3)}, {v(3)}, {}},
        {OpKind::BiasGrad, BiasAttrs{pa.n, pa.c, pa.h * pa.w}, {v(3)}, {v(4)}, {}},
        data,
        filter};
    for (const OpCall& c : calls) d.run(c);
    std::vector<Vec> want;
    for (int i : {3, 4, 7, 8}) want.push_back(read(d, v(i)));
    auto poison = [&](std::initializer_list<int> which) {
      for (int i : which) {
        const Vec nan(v(i).bytes / sizeof(float), NAN);
        d.copy_from_host(nan.data(), v(i));
      }
    };
    auto same_bits = [&](const Vec& a, const Vec& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    poison({3, 4, 7, 8});
    CHECK(fused_runner(d).run_fused(calls) == 5);
    for (int k = 0; k < 4; ++k)
      CHECK(same_bits(read(d, v(std::array{3, 4, 7, 8}[static_cast<size_t>(k)])), want[static_cast<size_t>(k)]));
    CHECK(std::any_of(want[3].begin(), want[3].end(), [](float f) { return f != 0.f; }));

    // The two convolutions alone, dy already there.
    const std::vector<OpCall> pair{data, filter};
    poison({7, 8});
    CHECK(fused_runner(d).run_fused(pair) == 2);
    CHECK(same_bits(read(d, v(7)), want[2]));
    CHECK(same_bits(read(d, v(8)), want[3]));

    // Not a pair: backward data's dx over backward filter's x (a later slice would read what an earlier one wrote),
    // or two different dy.
    std::vector<OpCall> bad = pair;
    bad[0].out[0] = v(6);
    CHECK(fused_runner(d).run_fused(bad) == 0);
    bad = pair;
    bad[1].in[1] = BufferView{v(0).block, v(0).offset, v(3).bytes};
    CHECK(fused_runner(d).run_fused(bad) == 0);
    // After the pool: backward filter's x over the pool's dx, which the pool writes while the filter reads x: the
    // pool and backward data fuse (four calls), backward filter runs alone.
    std::vector<OpCall> bad5 = calls;
    bad5[4].in[0] = BufferView{v(3).block, v(3).offset, v(6).bytes};
    CHECK(fused_runner(d).run_fused(bad5) == 4);
    d.free_block(wb);
  }
#endif
}

// Stride 1 with output rows as long as the input's ("same" in w) runs im2col and col2im as one shifted copy per tap
// (conv.cpp, im2col_shifted). The conformance table's same-padded cases are square kernels with symmetric padding;
// these cover the others: even kernels (the extra padding at the end, as TensorFlow pads), padding in w only, one
// column, more padding than the kernel reaches on one side. Integer-valued inputs: the sums are exact, so the CPU
// must equal the reference bit for bit, forward, backward data and backward filter, on 1 and 2 threads.

TEST_CASE("cpu fuses batch norm with the ReLU next to it, forward and backward, equal to the ops run one by one",
          "[cpu][fusion][batch_norm]") {
  auto cpu = open_cpu(2);
  Device& d = *cpu.device;
  for (const BatchNormAttrs a : {BatchNormAttrs{4, 3, 20}, BatchNormAttrs{6, 5, 3}}) {  // long runs, short runs
    const bool long_runs = a.inner >= 16;
    CAPTURE(a.inner);
    const int64_t count = a.n * a.c * a.inner;
    std::mt19937 gen(9);
    const Vec x = random_vec(count, gen, -2.f, 3.f), gamma = random_vec(a.c, gen, 0.5f, 1.5f),
              beta = random_vec(a.c, gen, -0.5f, 0.5f), dz = random_vec(count, gen);
    // 0 x, 1 gamma, 2 beta, 3 y, 4 mean, 5 rstd, 6 running mean, 7 running var, 8 z, 9 dy, 10 dx, 11 dgamma,
    // 12 dbeta, 13 dz
    Arena ar(d, {count, a.c, a.c, count, a.c, a.c, a.c, a.c, count, count, count, a.c, a.c, count});
    auto v = [&](int i) { return ar.view(static_cast<size_t>(i)); };
    d.copy_from_host(x.data(), v(0));
    d.copy_from_host(gamma.data(), v(1));
    d.copy_from_host(beta.data(), v(2));
    const Vec zeros(static_cast<size_t>(a.c), 0.f), ones(static_cast<size_t>(a.c), 1.f);
    const ActivationAttrs relu{Activation::relu, count};
    for (bool in_place : {false, true}) {
      CAPTURE(in_place);
      // Forward: z is y itself (in place) or its own buffer.
      const BufferView z = in_place ? v(3) : v(8);
      const std::vector<OpCall> fwd{
          {OpKind::BatchNormForward, a, {v(0), v(1), v(2)}, {v(3), v(4), v(5), v(6), v(7)}, {}},
          {OpKind::ActivationForward, relu, {v(3)}, {z}, {}}};
      auto run_fwd = [&](bool fused) {
        d.copy_from_host(zeros.data(), v(6));
        d.copy_from_host(ones.data(), v(7));
        if (fused) {
          CHECK(fused_runner(d).run_fused(fwd) == 2);
        } else {
          for (const OpCall& c : fwd) d.run(c);
        }
        return std::vector<Vec>{read(d, v(3)), read(d, z), read(d, v(4)), read(d, v(5)), read(d, v(6)), read(d, v(7))};
      };
      const auto unfused = run_fwd(false), fused = run_fwd(true);
      for (size_t i = 0; i < unfused.size(); ++i) CHECK(max_rel_diff(fused[i], unfused[i]) < 1e-6);
      CHECK(std::count_if(fused[1].begin(), fused[1].end(), [](float f) { return f == 0.f; }) > 0);  // the ReLU ran
      if (!in_place) CHECK(std::count_if(fused[0].begin(), fused[0].end(), [](float f) { return f < 0.f; }) > 0);

      // Backward: the ReLU's gradient over dz (in place) or into dy, the batch norm's dx over dy or its own buffer.
      const Vec zv = read(d, z);
      const BufferView dy = in_place ? v(13) : v(9), dx = in_place ? dy : v(10);
      const std::vector<OpCall> bwd{
          {OpKind::ActivationBackward, relu, {z, v(13)}, {dy}, {}},
          {OpKind::BatchNormBackward, a, {v(0), v(1), v(4), v(5), dy}, {dx, v(11), v(12)}, {}}};
      auto run_bwd = [&](bool fused) {
        d.copy_from_host(dz.data(), v(13));
        d.copy_from_host(zv.data(), z);
        size_t k = 0;
        if (fused) k = fused_runner(d).run_fused(bwd);
        if (k == 0)
          for (const OpCall& c : bwd) d.run(c);
        return std::make_pair(k, std::vector<Vec>{read(d, dy), read(d, dx), read(d, v(11)), read(d, v(12))});
      };
      const auto [k0, bu] = run_bwd(false);
      const auto [k, bf] = run_bwd(true);
      CHECK(k == (long_runs ? 2u : 0u));  // short runs (inner < 16) are not fused
      for (size_t i = 0; i < bu.size(); ++i) CHECK(max_rel_diff(bf[i], bu[i]) < 1e-6);
      // With dx apart, dx must not start where the ReLU's inputs are still to be read: a dx overlapping z by a
      // partial offset is left unfused.
      if (!in_place && long_runs) {
        std::vector<OpCall> shifted = bwd;
        shifted[1].out[0] = BufferView{z.block, z.offset + 4 * sizeof(float), z.bytes - 4 * sizeof(float)};
        CHECK(fused_runner(d).run_fused(shifted) == 0);
      }
    }
    // A synchronized batch norm is the data-parallel strategy's to run: never fused.
    BatchNormAttrs s = a;
    s.sync = true;
    const std::vector<OpCall> sync_fwd{
        {OpKind::BatchNormForward, s, {v(0), v(1), v(2)}, {v(3), v(4), v(5), v(6), v(7)}, {}},
        {OpKind::ActivationForward, relu, {v(3)}, {v(3)}, {}}};
    CHECK(fused_runner(d).run_fused(sync_fwd) == 0);
  }
}
