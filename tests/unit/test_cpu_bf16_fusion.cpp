// The cpu backend's fused runs on bf16 storage (fusion.cpp's 16-bit entry points, conv_dnnl.cpp's typed paths):
// - forward: a bf16 layer's conv + bias + ReLU (+ 2x2 max pool) in one call, each image coming back from oneDNN's
//   16-channel blocks with the bias and the ReLU applied on the way;
// - backward: the max pool's backward (with the ReLU's gradient and the bias gradient) as the prologue of each slice
//   of the backward convolution after it, and backward data and filter of one convolution in one pass: bit for bit
//   the ops run one by one.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cpu_test_support.hpp"
#include "kiln/half.hpp"
#include "kiln/ops.hpp"

using namespace kiln;
using namespace kiln::test::cpu;

namespace {

// Buffer i of the arena as n bf16 values.
BufferView b16(const Arena& arena, size_t i, int64_t n) {
  BufferView v = arena.view(i);
  v.bytes = static_cast<size_t>(n) * 2;
  v.dtype = DType::bf16;
  return v;
}
void put16(Device& d, const BufferView& v, const Vec& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = float_to_bf16(x[i]);
  d.copy_from_host(h.data(), v);
}
Vec read16(Device& d, const BufferView& v) {
  std::vector<uint16_t> h(v.bytes / 2);
  d.copy_to_host(v, h.data());
  Vec r(h.size());
  for (size_t i = 0; i < h.size(); ++i) r[i] = bf16_to_float(h[i]);
  return r;
}
void poison(Device& d, const BufferView& v) {
  const std::vector<uint8_t> nan(v.bytes, 0xff);  // NaN in bf16 and float32 alike
  d.copy_from_host(nan.data(), v);
}
BufferView with_workspace(Device& d, OpCall& c, Block*& block) {
  const size_t ws = d.workspace_bytes(c);
  block = ws ? d.allocate_block(ws) : nullptr;
  c.workspace = BufferView{block, 0, ws};
  return c.workspace;
}

}  // namespace

TEST_CASE("cpu fuses a bf16 conv + bias + relu + max pool, bit for bit the ops one by one", "[cpu][fusion][bf16]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev): no bf16 convolution to fuse");
#else
  struct G {
    const char* name;
    ConvAttrs a;
  };
  // 16 channels in (blocked input) and 1 (a first layer: plain input); 32 filters (two 16-channel blocks out); 13
  // images give two threads slices of unequal sizes; 20x20 outputs leave 400 % 16 = 0, 14x14 a ragged 196.
  const G geoms[] = {{"13x16x20x20.k32", ConvAttrs{13, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 20, 20}},
                     {"9x1x14x14.k32", ConvAttrs{9, 1, 14, 14, 32, 3, 3, 1, 1, 1, 1, 14, 14}}};
  for (int threads : {1, 2})
    for (const G& g : geoms)
      for (bool in_place : {true, false}) {
        CAPTURE(threads, g.name, in_place);
        auto cpu = open_cpu(threads);
        Device& d = *cpu.device;
        const ConvAttrs& a = g.a;
        const int64_t nx = a.n * a.c * a.h * a.w, nw = a.k * a.c * a.r * a.s, ny = a.n * a.k * a.oh * a.ow;
        const PoolAttrs pa{a.n, a.k, a.oh, a.ow, 2, 2, 2, 2, 0, 0, a.oh / 2, a.ow / 2};
        const int64_t np = a.n * a.k * pa.oh * pa.ow;
        std::mt19937 gen(11);
        // 0 x, 1 w, 2 bias (float32), 3 y, 4 the ReLU's output where not in place, 5 the pool's output
        Arena arena(d, {nx, nw, a.k, ny, ny, np});
        const BufferView x = b16(arena, 0, nx), w = b16(arena, 1, nw), y = b16(arena, 3, ny);
        const BufferView r = in_place ? y : b16(arena, 4, ny), p = b16(arena, 5, np);
        const BufferView& bias = arena.view(2);
        put16(d, x, random_vec(nx, gen));
        // Filters 3 and 5 are zero with subnormal biases: their outputs are the bias rounded to a bf16 subnormal
        // (which vcvtneps2bf16 would flush to zero, so the fused path must round those itself), positive and negative.
        Vec wv = random_vec(nw, gen);
        std::fill(wv.begin() + 3 * nw / a.k, wv.begin() + 4 * nw / a.k, 0.f);
        std::fill(wv.begin() + 5 * nw / a.k, wv.begin() + 6 * nw / a.k, 0.f);
        put16(d, w, wv);
        Vec bv = random_vec(a.k, gen, -0.5f, 0.5f);
        bv[3] = 3e-40f;
        bv[5] = -2e-40f;
        d.copy_from_host(bv.data(), bias);
        std::vector<OpCall> calls{{OpKind::Conv2dForward, a, {x, w}, {y}, {}},
                                  {OpKind::BiasAdd, BiasAttrs{a.n, a.k, a.oh * a.ow}, {y, bias}, {y}, {}},
                                  {OpKind::ActivationForward, ActivationAttrs{Activation::relu, ny}, {y}, {r}, {}},
                                  {OpKind::MaxPoolForward, pa, {r}, {p}, {}}};
        Block* wb = nullptr;
        with_workspace(d, calls[0], wb);
        for (const OpCall& c : calls) d.run(c);
        const Vec uy = read16(d, y), ur = read16(d, r), up = read16(d, p);
        for (const BufferView& v : {y, r, p}) poison(d, v);
        CHECK(fused_runner(d).run_fused(calls) == 4);
        const Vec fy = read16(d, y), fr = read16(d, r), fp = read16(d, p);

        // y: the bias added and rounded, and the ReLU applied, as the unfused ops do: bit for bit. A wrong channel,
        // image or pixel (a layout mix-up) or a bias added before the convolution's sum is rounded changes bits.
        size_t bad = 0;
        for (size_t i = 0; i < uy.size(); ++i)
          if (std::memcmp(&fy[i], &uy[i], sizeof(float)) != 0) ++bad;
        INFO(bad << " of " << uy.size() << " differ");
        CHECK(bad == 0);
        const auto subnormals =
            std::count_if(fy.begin(), fy.end(), [](float v) { return v != 0.f && std::abs(v) < 1e-38f; });
        CHECK(subnormals >= (in_place ? 1 : 2) * a.n * a.oh * a.ow);
        // In place, y is the ReLU's output; apart, y keeps the negatives and the ReLU's output is exactly ReLU(y).
        const auto negatives = std::count_if(fy.begin(), fy.end(), [](float v) { return v < 0.f; });
        if (in_place) {
          CHECK(negatives == 0);
        } else {
          CHECK(negatives > 0);
          bad = 0;
          for (size_t i = 0; i < fr.size(); ++i)
            if (fr[i] != (fy[i] < 0.f ? 0.f : fy[i])) ++bad;
          CHECK(bad == 0);
        }
        CHECK(std::none_of(fr.begin(), fr.end(), [](float v) { return v < 0.f || std::isnan(v); }));
        // The pool's output is exactly the maxima of the fused ReLU's output.
        bad = 0;
        for (int64_t pl = 0; pl < a.n * a.k; ++pl)
          for (int64_t oy = 0; oy < pa.oh; ++oy)
            for (int64_t ox = 0; ox < pa.ow; ++ox) {
              const float* rp = fr.data() + pl * a.oh * a.ow;
              const float m = std::max({rp[2 * oy * a.ow + 2 * ox], rp[2 * oy * a.ow + 2 * ox + 1],
                                        rp[(2 * oy + 1) * a.ow + 2 * ox], rp[(2 * oy + 1) * a.ow + 2 * ox + 1]});
              if (fp[static_cast<size_t>((pl * pa.oh + oy) * pa.ow + ox)] != m) ++bad;
            }
        CHECK(bad == 0);
        CHECK(fp == up);
        CHECK(fr == ur);
        if (wb) d.free_block(wb);
      }
#endif
}

TEST_CASE("cpu fuses the bf16 max-pool backward into the backward convolutions after it, bit for bit",
          "[cpu][fusion][bf16]") {
#ifndef KILN_CPU_HAS_DNNL
  KILN_SKIP("the cpu plugin was built without oneDNN (KILN_WITH_DNNL, libdnnl-dev): no bf16 convolution to fuse");
#else
  // 24 images: every thread count here gives slices of equal sizes, so the pair's room (its per-thread blocked
  // copies) stays below the float32 copies' that bounds it (conv_dnnl.cpp).
  const ConvAttrs ca{24, 16, 32, 24, 16, 3, 3, 1, 1, 1, 1, 32, 24};
  const PoolAttrs pa{ca.n, ca.k, ca.oh, ca.ow, 2, 2, 2, 2, 0, 0, ca.oh / 2, ca.ow / 2};
  const int64_t nx = pa.n * pa.c * pa.h * pa.w, ny = pa.n * pa.c * pa.oh * pa.ow;
  const int64_t nw = ca.k * ca.c * ca.r * ca.s, ncx = ca.n * ca.c * ca.h * ca.w;
  for (int threads : {1, 2, 3})
    for (DType dw_type : {DType::bf16, DType::f32}) {
      CAPTURE(threads, dw_type == DType::bf16);
      auto cpu = open_cpu(threads);
      Device& d = *cpu.device;
      std::mt19937 gen(8);
      std::uniform_int_distribution<int> small(-3, 2);
      Vec px(static_cast<size_t>(nx));
      for (auto& v : px) v = std::max(0.f, static_cast<float>(small(gen)));  // a ReLU's output: ties at 0
      // 0 pool x, 1 pool y, 2 pool dy, 3 dx (the convolution's dy), 4 db, 5 w, 6 conv x, 7 conv dx, 8 dw
      Arena arena(d, {nx, ny, ny, nx, pa.c, nw, ncx, ncx, nw});
      const BufferView v0 = b16(arena, 0, nx), v1 = b16(arena, 1, ny), v2 = b16(arena, 2, ny), v3 = b16(arena, 3, nx);
      const BufferView v5 = b16(arena, 5, nw), v6 = b16(arena, 6, ncx), v7 = b16(arena, 7, ncx);
      const BufferView& db = arena.view(4);
      BufferView dw = dw_type == DType::bf16 ? b16(arena, 8, nw) : arena.view(8);
      put16(d, v0, px);
      put16(d, v2, random_vec(ny, gen));
      put16(d, v5, random_vec(nw, gen));
      put16(d, v6, random_vec(ncx, gen));
      d.run(OpCall{OpKind::MaxPoolForward, pa, {v0}, {v1}, {}});
      OpCall data{OpKind::Conv2dBackwardData, ca, {v3, v5}, {v7}, {}};
      OpCall filter{OpKind::Conv2dBackwardFilter, ca, {v6, v3}, {dw}, {}};
      const size_t ws = std::max(d.workspace_bytes(data), d.workspace_bytes(filter));
      Block* wb = d.allocate_block(ws);
      REQUIRE(wb);
      data.workspace = BufferView{wb, 0, d.workspace_bytes(data)};
      filter.workspace = BufferView{wb, 0, d.workspace_bytes(filter)};
      const std::vector<OpCall> calls{
          {OpKind::MaxPoolBackward, pa, {v0, v1, v2}, {v3}, {}},
          {OpKind::ActivationBackward, ActivationAttrs{Activation::relu, nx}, {v0, v3}, {v3}, {}},
          {OpKind::BiasGrad, BiasAttrs{pa.n, pa.c, pa.h * pa.w}, {v3}, {db}, {}},
          data,
          filter};
      for (const OpCall& c : calls) d.run(c);
      auto raw = [&](const BufferView& v) {
        std::vector<uint8_t> h(v.bytes);
        d.copy_to_host(v, h.data());
        return h;
      };
      const auto want_dx = raw(v3), want_db = raw(db), want_cdx = raw(v7), want_dw = raw(dw);
      CHECK(std::any_of(want_dw.begin(), want_dw.end(), [](uint8_t b) { return b != 0; }));
      CHECK(std::any_of(want_cdx.begin(), want_cdx.end(), [](uint8_t b) { return b != 0; }));

      for (const BufferView& v : {v3, db, v7, dw}) poison(d, v);
      CHECK(fused_runner(d).run_fused(calls) == 5);
      CHECK(raw(v3) == want_dx);
      CHECK(raw(db) == want_db);
      CHECK(raw(v7) == want_cdx);
      CHECK(raw(dw) == want_dw);

      // The pair alone, dy already there.
      for (const BufferView& v : {v7, dw}) poison(d, v);
      CHECK(fused_runner(d).run_fused(std::vector<OpCall>{data, filter}) == 2);
      CHECK(raw(v7) == want_cdx);
      CHECK(raw(dw) == want_dw);

      // The pool's backward before backward filter alone (a first layer's, whose input needs no gradient).
      for (const BufferView& v : {v3, db, dw}) poison(d, v);
      CHECK(fused_runner(d).run_fused(std::vector<OpCall>{calls[0], calls[1], calls[2], filter}) == 4);
      CHECK(raw(v3) == want_dx);
      CHECK(raw(db) == want_db);
      CHECK(raw(dw) == want_dw);
      d.free_block(wb);
    }
#endif
}

TEST_CASE("cpu fuses bf16 batch norm with the ReLU next to it, forward and backward, bit for bit",
          "[cpu][fusion][bf16][batch_norm]") {
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
    // 12 dbeta, 13 dz; the activations (0, 3, 8, 9, 10, 13) bf16
    Arena ar(d, {count, a.c, a.c, count, a.c, a.c, a.c, a.c, count, count, count, a.c, a.c, count});
    auto v = [&](int i) {
      for (int h : {0, 3, 8, 9, 10, 13})
        if (i == h) return b16(ar, static_cast<size_t>(i), count);
      return ar.view(static_cast<size_t>(i));
    };
    put16(d, v(0), x);
    d.copy_from_host(gamma.data(), v(1));
    d.copy_from_host(beta.data(), v(2));
    const Vec zeros(static_cast<size_t>(a.c), 0.f), ones(static_cast<size_t>(a.c), 1.f);
    const ActivationAttrs relu{Activation::relu, count};
    auto raw = [&](const BufferView& b) {
      std::vector<uint8_t> h(b.bytes);
      d.copy_to_host(b, h.data());
      return h;
    };
    for (bool in_place : {false, true}) {
      CAPTURE(in_place);
      const BufferView z = in_place ? v(3) : v(8);
      const std::vector<OpCall> fwd{
          {OpKind::BatchNormForward, a, {v(0), v(1), v(2)}, {v(3), v(4), v(5), v(6), v(7)}, {}},
          {OpKind::ActivationForward, relu, {v(3)}, {z}, {}}};
      auto run_fwd = [&](bool fused) {
        d.copy_from_host(zeros.data(), v(6));
        d.copy_from_host(ones.data(), v(7));
        poison(d, v(3));
        poison(d, z);
        if (fused) {
          CHECK(fused_runner(d).run_fused(fwd) == 2);
        } else {
          for (const OpCall& c : fwd) d.run(c);
        }
        std::vector<std::vector<uint8_t>> r;
        for (int i : {3, 4, 5, 6, 7}) r.push_back(raw(v(i)));
        r.push_back(raw(z));
        return r;
      };
      const auto unfused = run_fwd(false), fused = run_fwd(true);
      for (size_t i = 0; i < unfused.size(); ++i) CHECK(fused[i] == unfused[i]);
      const Vec zf = read16(d, z), yf = read16(d, v(3));
      CHECK(std::count_if(zf.begin(), zf.end(), [](float f) { return f == 0.f; }) > 0);  // the ReLU ran
      if (!in_place) CHECK(std::count_if(yf.begin(), yf.end(), [](float f) { return f < 0.f; }) > 0);

      // Backward: the ReLU's gradient over dz (in place) or into dy, the batch norm's dx over dy or its own buffer.
      const auto zv = raw(z);
      const BufferView dy = in_place ? v(13) : v(9), dx = in_place ? dy : v(10);
      const std::vector<OpCall> bwd{
          {OpKind::ActivationBackward, relu, {z, v(13)}, {dy}, {}},
          {OpKind::BatchNormBackward, a, {v(0), v(1), v(4), v(5), dy}, {dx, v(11), v(12)}, {}}};
      auto run_bwd = [&](bool fused) {
        put16(d, v(13), dz);
        d.copy_from_host(zv.data(), z);
        size_t k = 0;
        if (fused) k = fused_runner(d).run_fused(bwd);
        if (k == 0)
          for (const OpCall& c : bwd) d.run(c);
        return std::make_pair(k, std::vector<std::vector<uint8_t>>{raw(dy), raw(dx), raw(v(11)), raw(v(12))});
      };
      const auto [k0, bu] = run_bwd(false);
      const auto [k, bf] = run_bwd(true);
      CHECK(k == (long_runs ? 2u : 0u));  // short runs (inner < 16) are not fused
      for (size_t i = 0; i < bu.size(); ++i) CHECK(bf[i] == bu[i]);
    }
  }
}

TEST_CASE("cpu bias_grad sums bf16 planes as it sums their float32 copies, bit for bit", "[cpu][fusion][bf16]") {
  // The fused max-pool backward computes each plane's sum for the bias gradient with the same function; planes longer
  // than the kernels' 512-value tiles (a 28x28 image) must not be summed in pieces on one path and whole on the other.
  // Magnitudes from 2^-12 to 2^8 make the float32 sums inexact, so a different order of the adds shows in the bits.
  const BiasAttrs a{5, 3, 28 * 28};
  const int64_t n = a.outer * a.channels * a.inner;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> e(-12.f, 8.f);
  std::bernoulli_distribution sign(0.5);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16_to_float(float_to_bf16((sign(gen) ? -1.f : 1.f) * std::exp2(e(gen))));
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto cpu = open_cpu(threads);
    Device& d = *cpu.device;
    Arena arena(d, {n, n, a.channels, a.channels});
    const BufferView x16 = b16(arena, 0, n), &x32 = arena.view(1), &db16 = arena.view(2), &db32 = arena.view(3);
    put16(d, x16, v);
    d.copy_from_host(v.data(), x32);
    d.run(OpCall{OpKind::BiasGrad, a, {x16}, {db16}, {}});
    d.run(OpCall{OpKind::BiasGrad, a, {x32}, {db32}, {}});
    Vec g16(static_cast<size_t>(a.channels)), g32(g16.size());
    d.copy_to_host(db16, g16.data());
    d.copy_to_host(db32, g32.data());
    CHECK(std::memcmp(g16.data(), g32.data(), g16.size() * sizeof(float)) == 0);
    CHECK(std::any_of(g32.begin(), g32.end(), [](float s) { return s != 0.f; }));
  }
}

TEST_CASE("cpu max pool on bf16 gives the float32 path's bits: ties, zeros, -0 and NaN", "[cpu][fusion][bf16]") {
  // A maximum of bf16 values is one of them, and the backward pass's gradients are dy's values or +0: the bf16 kernels
  // (16 windows a vector where the CPU has AVX-512, 8 with AVX2) must store exactly what the float32 ones store for
  // the same values. Values from a small set make ties (the first corner wins) and zeros of both signs common; a few
  // NaNs test the ordered comparisons (a NaN first corner stays the maximum, a later one never replaces it). Rows of
  // 19 windows take a whole vector and a masked tail, odd widths and heights an unpooled last column and row. Even
  // widths up to 16 (14, 16, 2) take the AVX-512 backward that loads a row of windows' two image rows as one vector;
  // there the fused backward with the ReLU's gradient must also equal the ops one by one.
  const PoolAttrs pools[] = {
      PoolAttrs{3, 5, 39, 38, 2, 2, 2, 2, 0, 0, 19, 19}, PoolAttrs{4, 6, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14},
      PoolAttrs{5, 7, 14, 15, 2, 2, 2, 2, 0, 0, 7, 7},   PoolAttrs{4, 6, 14, 14, 2, 2, 2, 2, 0, 0, 7, 7},
      PoolAttrs{3, 5, 9, 16, 2, 2, 2, 2, 0, 0, 4, 8},    PoolAttrs{24, 8, 5, 2, 2, 2, 2, 2, 0, 0, 2, 1}};
  const float set[] = {-1.f, -0.f, 0.f, 0.5f, 1.f, 2.f, std::numeric_limits<float>::quiet_NaN()};
  for (int threads : {1, 2})
    for (const PoolAttrs& a : pools) {
      CAPTURE(threads, a.h, a.w);
      auto cpu = open_cpu(threads);
      Device& d = *cpu.device;
      const int64_t nx = a.n * a.c * a.h * a.w, ny = a.n * a.c * a.oh * a.ow;
      std::mt19937 gen(5);
      std::discrete_distribution<int> pick({20, 10, 20, 20, 20, 10, 1});
      Vec x(static_cast<size_t>(nx)), dy = random_vec(ny, gen);
      for (auto& v : x) v = set[pick(gen)];
      for (auto& v : dy) v = bf16_to_float(float_to_bf16(v));
      // 0-3: x, y, dy, dx in float32; 4-7 the same in bf16
      Arena arena(d, {nx, ny, ny, nx, nx, ny, ny, nx});
      BufferView f[4], h[4];
      for (size_t i = 0; i < 4; ++i) f[i] = arena.view(i);
      h[0] = b16(arena, 4, nx), h[1] = b16(arena, 5, ny), h[2] = b16(arena, 6, ny), h[3] = b16(arena, 7, nx);
      d.copy_from_host(x.data(), f[0]);
      d.copy_from_host(dy.data(), f[2]);
      put16(d, h[0], x);
      put16(d, h[2], dy);
      for (const BufferView* t : {f, h}) {
        d.run(OpCall{OpKind::MaxPoolForward, a, {t[0]}, {t[1]}, {}});
        d.run(OpCall{OpKind::MaxPoolBackward, a, {t[0], t[1], t[2]}, {t[3]}, {}});
      }
      for (size_t i : {size_t{1}, size_t{3}}) {
        Vec v32(f[i].bytes / 4);
        d.copy_to_host(f[i], v32.data());
        const Vec v16 = read16(d, h[i]);
        size_t bad = 0;
        for (size_t j = 0; j < v32.size(); ++j)
          if (std::memcmp(&v32[j], &v16[j], sizeof(float)) != 0) ++bad;
        INFO((i == 1 ? "y: " : "dx: ") << bad << " of " << v32.size() << " differ");
        CHECK(bad == 0);
        // The values make the cases the comment names happen.
        const bool nans = std::any_of(v32.begin(), v32.end(), [](float v) { return std::isnan(v); });
        const bool negative_zeros =
            std::any_of(v32.begin(), v32.end(), [](float v) { return v == 0.f && std::signbit(v); });
        CHECK(nans == (i == 1));
        CHECK(negative_zeros == (i == 1));
      }
      // The ReLU's gradient in the pool's backward (fused, [memory] inplace) against the two ops one by one.
      const std::vector<OpCall> calls{
          {OpKind::MaxPoolBackward, a, {h[0], h[1], h[2]}, {h[3]}, {}},
          {OpKind::ActivationBackward, ActivationAttrs{Activation::relu, nx}, {h[0], h[3]}, {h[3]}, {}}};
      for (const OpCall& c : calls) d.run(c);
      const Vec want = read16(d, h[3]);
      poison(d, h[3]);
      CHECK(fused_runner(d).run_fused(calls) == 2);
      const Vec got = read16(d, h[3]);
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      CHECK(std::any_of(want.begin(), want.end(), [](float v) { return v != 0.f; }));
    }
}
