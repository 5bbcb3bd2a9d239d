// Parameter initialization's random numbers: the values of std::mt19937_64 with libstdc++'s
// uniform_real_distribution<double> and normal_distribution<double> over it, bit for bit, computed a block of 312
// draws at a time so the compiler vectorizes the engine's twist, its tempering and the conversion to double.
// (libstdc++'s generate_canonical evaluates a long-double logarithm on every draw; with it a 206M-parameter model
// spent 4 s initializing.) Private to core; tests/unit/test_init_random.cpp checks it against the standard library.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace kiln::detail {

class Mt19937_64 {
 public:
  static constexpr int kN = 312, kM = 156;
  explicit Mt19937_64(uint64_t seed) {
    x_[0] = seed;
    for (int i = 1; i < kN; ++i)
      x_[i] = 6364136223846793005ull * (x_[i - 1] ^ (x_[i - 1] >> 62)) + static_cast<uint64_t>(i);
    p_ = kN;
  }
  uint64_t operator()() {
    if (p_ >= kN) twist();
    return temper(x_[p_++]);
  }
  // The next `count` (<= kN) outputs, tempered, into out.
  void block(uint64_t* out, int count) {
    int done = 0;
    while (done < count) {
      if (p_ >= kN) twist();
      const int take = std::min(count - done, kN - p_);
      for (int i = 0; i < take; ++i) out[done + i] = temper(x_[p_ + i]);
      p_ += take;
      done += take;
    }
  }

 private:
  static uint64_t temper(uint64_t y) {
    y ^= (y >> 29) & 0x5555555555555555ull;
    y ^= (y << 17) & 0x71D67FFFEDA60000ull;
    y ^= (y << 37) & 0xFFF7EEE000000000ull;
    return y ^ (y >> 43);
  }
  static uint64_t mix(uint64_t lo_word, uint64_t hi_word, uint64_t far) {
    const uint64_t upper = ~uint64_t{0} << 31;
    const uint64_t y = (lo_word & upper) | (hi_word & ~upper);
    return far ^ (y >> 1) ^ ((0 - (y & 1)) & 0xB5026F5AA96619E9ull);  // branch-free: the loops vectorize
  }
  void twist() {
    for (int k = 0; k < kN - kM; ++k) x_[k] = mix(x_[k], x_[k + 1], x_[k + kM]);
    for (int k = kN - kM; k < kN - 1; ++k) x_[k] = mix(x_[k], x_[k + 1], x_[k + kM - kN]);
    x_[kN - 1] = mix(x_[kN - 1], x_[0], x_[kM - 1]);
    p_ = 0;
  }
  uint64_t x_[kN];
  int p_;
};

// double(x), correctly rounded, from two exact halves and one rounding addition (vectorizes without AVX-512).
inline double u64_to_double(uint64_t x) {
  const double lo = std::bit_cast<double>(0x4330000000000000ull | (x & 0xffffffffull)) - 0x1p52;
  const double hi = std::bit_cast<double>(0x4530000000000000ull | (x >> 32)) - 0x1p84;
  return hi + lo;
}

// generate_canonical<double, 53> over a 64-bit engine: x / 2^64, and the largest double below 1 when that rounds to 1.
inline double canonical(uint64_t x) {
  const double u = u64_to_double(x) * 0x1p-64;
  return u >= 1.0 ? 0x1.fffffffffffffp-1 : u;
}

// uniform_real_distribution<double>(a, b) draws, rounded to float.
inline void fill_uniform(float* out, int64_t n, Mt19937_64& rng, double a, double b) {
  uint64_t raw[Mt19937_64::kN];
  for (int64_t i = 0; i < n; i += Mt19937_64::kN) {
    const int count = static_cast<int>(std::min<int64_t>(Mt19937_64::kN, n - i));
    rng.block(raw, count);
    for (int j = 0; j < count; ++j) out[i + j] = static_cast<float>(canonical(raw[j]) * (b - a) + a);
  }
}

// normal_distribution<double>(0, stddev) draws (Marsaglia's polar method, the second value of each pair saved for
// the next draw, as libstdc++ does), rounded to float.
inline void fill_normal(float* out, int64_t n, Mt19937_64& rng, double stddev) {
  int64_t i = 0;
  while (i < n) {
    double x, y, r2;
    do {
      x = 2.0 * canonical(rng()) - 1.0;
      y = 2.0 * canonical(rng()) - 1.0;
      r2 = x * x + y * y;
    } while (r2 > 1.0 || r2 == 0.0);
    const double mult = std::sqrt(-2 * std::log(r2) / r2);
    out[i++] = static_cast<float>(y * mult * stddev + 0.0);
    if (i < n) out[i++] = static_cast<float>(x * mult * stddev + 0.0);
  }
}

}  // namespace kiln::detail
