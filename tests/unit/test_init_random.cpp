// Parameter initialization's random numbers (core/src/engine/init_random.hpp) are the standard library's, bit for bit:
// a checkpoint or a result recorded before the faster initialization still describes the same initial weights.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../../core/src/engine/init_random.hpp"
#include "kiln/config.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

using kiln::detail::Mt19937_64;

namespace {
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

TEST_CASE("The initializer's engine gives std::mt19937_64's outputs, across refills and in blocks", "[init]") {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{5489}, uint64_t{0xdeadbeefcafef00dull}, ~uint64_t{0}}) {
    std::mt19937_64 ref(seed);
    Mt19937_64 a(seed);
    for (int i = 0; i < 2000; ++i) REQUIRE(a() == ref());
    std::vector<uint64_t> blk(Mt19937_64::kN);
    std::mt19937_64 ref2(seed);
    Mt19937_64 c(seed);
    for (int count : {1, 311, 312, 2, 200, 312, 5}) {  // blocks straddling the refills
      c.block(blk.data(), count);
      for (int j = 0; j < count; ++j) REQUIRE(blk[j] == ref2());
    }
  }
}

TEST_CASE("The initializer's integer to double conversion rounds as the compiler's does", "[init]") {
  std::vector<uint64_t> xs{0,
                           1,
                           (uint64_t{1} << 53) - 1,
                           uint64_t{1} << 53,
                           (uint64_t{1} << 53) + 1,
                           (uint64_t{1} << 53) + 3,
                           0xffffffffull,
                           0x100000000ull,
                           ~uint64_t{0},
                           ~uint64_t{0} - 1024,
                           ~uint64_t{0} - 1025,
                           0x8000000000000400ull,
                           0x8000000000000401ull,
                           0x8000000000000c00ull};
  std::mt19937_64 g(3);
  for (int i = 0; i < 100000; ++i) xs.push_back(g() >> (g() % 64));
  for (uint64_t x : xs) REQUIRE(kiln::detail::u64_to_double(x) == static_cast<double>(x));
  // 2^64 - 1 rounds to 2^64: the canonical draw is then the largest double below 1, as generate_canonical returns.
  CHECK(kiln::detail::canonical(~uint64_t{0}) == std::nextafter(1.0, 0.0));
  CHECK(kiln::detail::canonical(0) == 0.0);
}

TEST_CASE("Uniform and normal initial values equal std::uniform_real_distribution's and std::normal_distribution's",
          "[init]") {
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{311}, int64_t{312}, int64_t{313}, int64_t{10007}}) {
    for (uint64_t seed : {uint64_t{7}, uint64_t{123456789}}) {
      {
        const double limit = 0.0732;
        std::mt19937_64 ref(seed);
        std::uniform_real_distribution<double> d(-limit, limit);
        Mt19937_64 rng(seed);
        std::vector<float> got(static_cast<size_t>(n));
        kiln::detail::fill_uniform(got.data(), n, rng, -limit, limit);
        for (int64_t i = 0; i < n; ++i) REQUIRE(same_bits(got[i], static_cast<float>(d(ref))));
      }
      {
        const double stddev = 0.02;
        std::mt19937_64 ref(seed);
        std::normal_distribution<double> d(0.0, stddev);
        Mt19937_64 rng(seed);
        std::vector<float> got(static_cast<size_t>(n));
        kiln::detail::fill_normal(got.data(), n, rng, stddev);
        for (int64_t i = 0; i < n; ++i) REQUIRE(same_bits(got[i], static_cast<float>(d(ref))));
      }
    }
  }
}

TEST_CASE(
    "A model's initial weights, filled on every core straight into device memory, are the standard library's draws",
    "[init]") {
  // 2.1M parameters: above the size where initialization uses threads. init_std is held as a float. Each tensor's
  // stream is mt19937_64 seeded with FNV-1a of its name xor the run seed.
  auto cfg = kiln::Config::load_string(
      "[run]\nseed = 5\n[device]\nbackend = \"cpu\"\n[model]\ninput_shape = [1024]\nloss = \"softmax_cross_entropy\"\n"
      "[[model.layers]]\nname = \"a\"\ntype = \"dense\"\nunits = 1024\n"
      "[[model.layers]]\nname = \"b\"\ntype = \"dense\"\nunits = 1000\ninit_std = 0.02\n"
      "[[model.layers]]\nname = \"c\"\ntype = \"dense\"\nunits = 3\n"
      "[optimizer]\ntype = \"adam\"\nema = 0.99\n[train]\nbatch_size = 4\n"
      "[data.train]\nstages = [{ type = \"synthetic\", shape = [1024], classes = 3, examples = 8, seed = 3 }, { type = "
      "\"batch\" }]\n",
      "init.toml");
  kiln::Session s(cfg, kiln::test::registry());
  s.open_devices();
  auto runner = s.strategy().create(s.runner_context());
  auto state = runner->save_state();
  auto stream = [](const std::string& name) {
    uint64_t h = 1469598103934665603ull ^ 5u;
    for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
    return std::mt19937_64(h);
  };
  struct Want {
    std::string name;
    double limit_or_std;
    bool normal;
  };
  for (const Want& w :
       {Want{"a.kernel", std::sqrt(6.0 / (1024 + 1024)), false}, Want{"b.kernel", static_cast<double>(0.02f), true},
        Want{"c.kernel", std::sqrt(6.0 / (1000 + 3)), false}}) {
    INFO(w.name);
    REQUIRE(state.count(w.name));
    const auto& got = state.at(w.name).data;
    auto rng = stream(w.name);
    std::uniform_real_distribution<double> u(-w.limit_or_std, w.limit_or_std);
    std::normal_distribution<double> n(0.0, w.limit_or_std);
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(same_bits(got[i], static_cast<float>(w.normal ? n(rng) : u(rng))));
    // The EMA shadow starts as a copy of the weights it averages, made after they were filled.
    REQUIRE(state.count(w.name + "/ema"));
    CHECK(state.at(w.name + "/ema").data == got);
  }
  CHECK(state.at("a.bias").data == std::vector<float>(1024, 0.f));
}
