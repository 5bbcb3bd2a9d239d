// The reference ops (the oracle of every backend): hand-computed cases for each op, and every backward op
// checked by central finite differences against its forward.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/reference.hpp"

using namespace kiln;
using Vec = std::vector<float>;

namespace {

// Runs the reference op on vectors; outputs must be pre-sized (read-write outputs carry their old values).
void ref(OpKind k, const OpAttrs& a, const std::vector<const Vec*>& in, const std::vector<Vec*>& out) {
  std::vector<const float*> ip;
  std::vector<float*> op;
  for (auto* v : in) ip.push_back(v->data());
  for (auto* v : out) op.push_back(v->data());
  reference_op(k, a, ip, op);
}

Vec rand_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Checks analytic[i] == d f / d x[i] by central differences, for every element of x.
void check_gradient(Vec& x, const std::function<double()>& f, const Vec& analytic, double eps = 1e-2,
                    double tol = 2e-3) {
  REQUIRE(analytic.size() == x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + float(eps);
    const double up = f();
    x[i] = keep - float(eps);
    const double down = f();
    x[i] = keep;
    const double numeric = (up - down) / (2 * eps);
    INFO("element " << i << " numeric " << numeric << " analytic " << analytic[i]);
    CHECK(std::abs(numeric - analytic[i]) <= tol * (1.0 + std::abs(numeric)));
  }
}

}  // namespace

TEST_CASE("reference gemm computes a hand-checked 2x2 product with alpha, beta and transposes", "[reference]") {
  Vec A{1, 2, 3, 4}, B{5, 6, 7, 8}, y{1, 1, 1, 1};
  ref(OpKind::Gemm, GemmAttrs{2, 2, 2, false, false, 1.f, 0.f}, {&A, &B}, {&y});
  CHECK(y == Vec{19, 22, 43, 50});
  y = {1, 1, 1, 1};
  ref(OpKind::Gemm, GemmAttrs{2, 2, 2, true, false, 2.f, 1.f}, {&A, &B}, {&y});  // 2 * A^T B + y
  CHECK(y == Vec{2 * 26 + 1, 2 * 30 + 1, 2 * 38 + 1, 2 * 44 + 1});
  y = {NAN, NAN, NAN, NAN};                                                      // beta == 0 never reads y
  ref(OpKind::Gemm, GemmAttrs{2, 2, 2, false, true, 1.f, 0.f}, {&A, &B}, {&y});  // A B^T
  CHECK(y == Vec{17, 23, 39, 53});
}

TEST_CASE("reference gemm gradients w.r.t. A and B match finite differences for every transpose", "[reference]") {
  const int64_t m = 3, n = 4, k = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      Vec A = rand_vec(m * k, 1), B = rand_vec(k * n, 2), R = rand_vec(m * n, 3), y(m * n);
      auto loss = [&] {
        ref(OpKind::Gemm, GemmAttrs{m, n, k, ta, tb, 1.f, 0.f}, {&A, &B}, {&y});
        return dot(y, R);
      };
      // dA = R op(B)^T stored like A; dB = op(A)^T R stored like B.
      Vec dA(m * k), dB(k * n);
      if (!ta)
        ref(OpKind::Gemm, GemmAttrs{m, k, n, false, !tb, 1.f, 0.f}, {&R, &B}, {&dA});  // (m,n)(n,k)
      else
        ref(OpKind::Gemm, GemmAttrs{k, m, n, tb, true, 1.f, 0.f}, {&B, &R}, {&dA});  // (k,n)(n,m)
      if (!tb)
        ref(OpKind::Gemm, GemmAttrs{k, n, m, !ta, false, 1.f, 0.f}, {&A, &R}, {&dB});  // (k,m)(m,n)
      else
        ref(OpKind::Gemm, GemmAttrs{n, k, m, true, ta, 1.f, 0.f}, {&R, &A}, {&dB});  // (n,m)(m,k)
      check_gradient(A, loss, dA);
      check_gradient(B, loss, dB);
    }
}

TEST_CASE("reference bias add and bias grad are hand-checked and adjoint", "[reference]") {
  BiasAttrs a{2, 3, 2};
  Vec x(12, 1.f), b{10, 20, 30}, y(12);
  ref(OpKind::BiasAdd, a, {&x, &b}, {&y});
  CHECK(y == Vec{11, 11, 21, 21, 31, 31, 11, 11, 21, 21, 31, 31});
  Vec dy = rand_vec(12, 4), db(3);
  ref(OpKind::BiasGrad, a, {&dy}, {&db});
  CHECK(db[1] == Approx(dy[2] + dy[3] + dy[8] + dy[9]));
  check_gradient(
      b,
      [&] {
        ref(OpKind::BiasAdd, a, {&x, &b}, {&y});
        return dot(y, dy);
      },
      db);
}

TEST_CASE("reference conv2d forward matches a hand-computed case with padding and stride", "[reference]") {
  // x: 1x1x3x3 = 1..9, w: 1x1x2x2 = [1 0; 0 -1], pad 1, stride 2 -> oh = ow = 2.
  ConvAttrs a{1, 1, 3, 3, 1, 2, 2, 2, 2, 1, 1, 2, 2};
  Vec x{1, 2, 3, 4, 5, 6, 7, 8, 9}, w{1, 0, 0, -1}, y(4);
  ref(OpKind::Conv2dForward, a, {&x, &w}, {&y});
  // Windows start at (-1,-1), (-1,1), (1,-1), (1,1): y = x[r0][c0] - x[r0+1][c0+1] over valid taps.
  CHECK(y == Vec{-1, -3, -7, 5 - 9});
}

TEST_CASE("reference conv2d backward data and filter match finite differences", "[reference]") {
  const std::vector<ConvAttrs> cases = {
      {2, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1, 5, 4},  // same padding
      {1, 3, 7, 6, 2, 3, 2, 2, 3, 1, 0, 4, 2},  // strides, asymmetric kernel
      {2, 2, 4, 4, 3, 1, 1, 1, 1, 0, 0, 4, 4},  // pointwise
      {1, 1, 5, 5, 1, 3, 3, 2, 2, 1, 1, 2, 2},  // oh smaller than the padded image allows
  };
  for (const auto& a : cases) {
    INFO("conv n" << a.n << " c" << a.c << " " << a.h << "x" << a.w << " k" << a.k << " " << a.r << "x" << a.s);
    Vec x = rand_vec(a.n * a.c * a.h * a.w, 5), w = rand_vec(a.k * a.c * a.r * a.s, 6);
    Vec R = rand_vec(a.n * a.k * a.oh * a.ow, 7), y(R.size()), dx(x.size()), dw(w.size());
    auto loss = [&] {
      ref(OpKind::Conv2dForward, a, {&x, &w}, {&y});
      return dot(y, R);
    };
    ref(OpKind::Conv2dBackwardData, a, {&R, &w}, {&dx});
    ref(OpKind::Conv2dBackwardFilter, a, {&x, &R}, {&dw});
    check_gradient(x, loss, dx);
    check_gradient(w, loss, dw);
  }
}

TEST_CASE("reference max pool takes the window max and routes the gradient to the first maximum", "[reference]") {
  PoolAttrs a{1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 2, 2};
  Vec x{1, 5, 2, 2, 3, 4, 2, 2, -1, -2, 0, 0, -3, -4, 0, 7}, y(4);
  ref(OpKind::MaxPoolForward, a, {&x}, {&y});
  CHECK(y == Vec{5, 2, -1, 7});
  Vec dy{1, 2, 3, 4}, dx(16, 99.f);
  ref(OpKind::MaxPoolBackward, a, {&x, &y, &dy}, {&dx});
  // The tie of 2s in the top-right window goes to its first element (row 0, col 2).
  CHECK(dx == Vec{0, 1, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 4});
  // Padding never wins and an all-padding window gives 0.
  PoolAttrs p{1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3};
  Vec xn{-5, -6, -7, -8}, yn(9, 42.f);
  ref(OpKind::MaxPoolForward, p, {&xn}, {&yn});
  CHECK(yn == Vec{0, 0, 0, 0, -5, 0, 0, 0, 0});
}

TEST_CASE("reference pooling backward passes match finite differences", "[reference]") {
  const std::vector<PoolAttrs> cases = {
      {2, 2, 6, 6, 2, 2, 2, 2, 0, 0, 3, 3},
      {1, 2, 7, 5, 3, 3, 2, 2, 1, 1, 4, 3},
      {1, 1, 5, 5, 3, 2, 1, 1, 1, 0, 5, 4},  // overlapping windows
  };
  for (const auto& a : cases) {
    INFO("pool " << a.h << "x" << a.w << " window " << a.kh << "x" << a.kw);
    // Distinct values spaced wider than the finite-difference step, so the argmax is stable.
    Vec x(a.n * a.c * a.h * a.w);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 37) % x.size()) * 0.1f - 1.f;
    Vec R = rand_vec(a.n * a.c * a.oh * a.ow, 8), y(R.size()), dx(x.size());
    ref(OpKind::MaxPoolForward, a, {&x}, {&y});
    ref(OpKind::MaxPoolBackward, a, {&x, &y, &R}, {&dx});
    check_gradient(
        x,
        [&] {
          ref(OpKind::MaxPoolForward, a, {&x}, {&y});
          return dot(y, R);
        },
        dx, 1e-2);
    ref(OpKind::AvgPoolBackward, a, {&R}, {&dx});
    check_gradient(
        x,
        [&] {
          ref(OpKind::AvgPoolForward, a, {&x}, {&y});
          return dot(y, R);
        },
        dx);
  }
}

TEST_CASE("reference avg pool divides by the number of valid elements only", "[reference]") {
  PoolAttrs a{1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3};
  Vec x{1, 2, 3, 4}, y(9);
  ref(OpKind::AvgPoolForward, a, {&x}, {&y});
  CHECK(y == Vec{1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4});
  Vec dy(9, 1.f), dx(4);
  ref(OpKind::AvgPoolBackward, a, {&dy}, {&dx});
  // Element (0,0) is in windows of counts 1, 2, 2, 4.
  CHECK(dx[0] == Approx(1 + 0.5 + 0.5 + 0.25));
}

TEST_CASE("reference activations give known values and their backward matches finite differences", "[reference]") {
  Vec x{-2.f, -0.5f, 0.25f, 3.f}, y(4);
  ref(OpKind::ActivationForward, ActivationAttrs{Activation::relu, 4}, {&x}, {&y});
  CHECK(y == Vec{0, 0, 0.25f, 3});
  ref(OpKind::ActivationForward, ActivationAttrs{Activation::sigmoid, 4}, {&x}, {&y});
  CHECK(y[3] == Approx(1.0 / (1.0 + std::exp(-3.0))));
  ref(OpKind::ActivationForward, ActivationAttrs{Activation::tanh, 4}, {&x}, {&y});
  CHECK(y[0] == Approx(std::tanh(-2.0)));
  Vec nan{NAN};
  ref(OpKind::ActivationForward, ActivationAttrs{Activation::relu, 1}, {&nan}, {&nan});
  CHECK(std::isnan(nan[0]));  // relu does not hide NaN

  for (Activation act : {Activation::relu, Activation::sigmoid, Activation::tanh}) {
    INFO("activation " << activation_name(act));
    Vec v = rand_vec(20, 9, -3.f, 3.f);
    for (auto& e : v)
      if (std::abs(e) < 0.05f) e = 0.5f;  // keep relu away from its kink
    Vec R = rand_vec(20, 10), out(20), dx(20);
    ActivationAttrs a{act, 20};
    ref(OpKind::ActivationForward, a, {&v}, {&out});
    ref(OpKind::ActivationBackward, a, {&out, &R}, {&dx});
    check_gradient(
        v,
        [&] {
          ref(OpKind::ActivationForward, a, {&v}, {&out});
          return dot(out, R);
        },
        dx, 1e-3);
  }
}

TEST_CASE("reference softmax is hand-checked, max-subtracted, and its backward matches finite differences",
          "[reference]") {
  Vec x{0.f, std::log(2.f), 1000.f, 1000.f}, y(4);
  ref(OpKind::SoftmaxForward, SoftmaxAttrs{2, 2}, {&x}, {&y});
  CHECK(y[0] == Approx(1.0 / 3));
  CHECK(y[1] == Approx(2.0 / 3));
  CHECK(y[2] == Approx(0.5));  // no overflow at 1000
  SoftmaxAttrs a{3, 5};
  Vec v = rand_vec(15, 11, -2, 2), R = rand_vec(15, 12), out(15), dx(15);
  ref(OpKind::SoftmaxForward, a, {&v}, {&out});
  ref(OpKind::SoftmaxBackward, a, {&out, &R}, {&dx});
  check_gradient(
      v,
      [&] {
        ref(OpKind::SoftmaxForward, a, {&v}, {&out});
        return dot(out, R);
      },
      dx, 1e-3);
}

TEST_CASE("reference softmax cross-entropy is hand-checked and its gradient output matches finite differences",
          "[reference]") {
  Vec x{0.f, std::log(3.f)}, labels{1.f}, loss(1), dx(2);
  ref(OpKind::SoftmaxCrossEntropy, LossAttrs{1, 2, 0.5f}, {&x, &labels}, {&loss, &dx});
  CHECK(loss[0] == Approx(0.5 * -std::log(0.75)));
  CHECK(dx[0] == Approx(0.5 * 0.25));
  CHECK(dx[1] == Approx(0.5 * (0.75 - 1)));
  labels[0] = 2.f;  // out of range
  ref(OpKind::SoftmaxCrossEntropy, LossAttrs{1, 2, 0.5f}, {&x, &labels}, {&loss, &dx});
  CHECK(std::isnan(loss[0]));

  LossAttrs a{4, 6, 0.25f};
  Vec v = rand_vec(24, 13, -2, 2), lab{0, 5, 2, 3}, g(24);
  ref(OpKind::SoftmaxCrossEntropy, a, {&v, &lab}, {&loss, &g});
  check_gradient(
      v,
      [&] {
        Vec d(24);
        ref(OpKind::SoftmaxCrossEntropy, a, {&v, &lab}, {&loss, &d});
        return double(loss[0]);
      },
      g, 1e-2);
}

TEST_CASE("reference MSE and BCE losses are hand-checked and their gradients match finite differences", "[reference]") {
  Vec p{1.f, 2.f}, t{0.f, 4.f}, loss(1), g(2);
  ref(OpKind::MeanSquaredError, LossAttrs{1, 2, 1.f}, {&p, &t}, {&loss, &g});
  CHECK(loss[0] == Approx((1.0 + 4.0) / 2));
  CHECK(g == Vec{1.f, -2.f});
  Vec z{0.f}, tz{1.f}, lz(1), gz(1);
  ref(OpKind::BinaryCrossEntropy, LossAttrs{1, 1, 1.f, true}, {&z, &tz}, {&lz, &gz});
  CHECK(lz[0] == Approx(std::log(2.0)));
  CHECK(gz[0] == Approx(-0.5));
  Vec pr{0.25f};
  ref(OpKind::BinaryCrossEntropy, LossAttrs{1, 1, 1.f, false}, {&pr, &tz}, {&lz, &gz});
  CHECK(lz[0] == Approx(-std::log(0.25)));
  CHECK(gz[0] == Approx((0.25 - 1) / (0.25 * 0.75)));

  for (OpKind k : {OpKind::MeanSquaredError, OpKind::BinaryCrossEntropy})
    for (bool logits : {true, false}) {
      if (k == OpKind::MeanSquaredError && !logits) continue;
      INFO(op_name(k) << " from_logits " << logits);
      LossAttrs a{3, 4, 0.5f, logits};
      Vec v = logits ? rand_vec(12, 14, -3, 3) : rand_vec(12, 14, 0.1f, 0.9f), tt = rand_vec(12, 15, 0, 1), d(12);
      ref(k, a, {&v, &tt}, {&loss, &d});
      check_gradient(
          v,
          [&] {
            Vec s(12);
            ref(k, a, {&v, &tt}, {&loss, &s});
            return double(loss[0]);
          },
          d, 1e-3);
    }
}

TEST_CASE("reference elementwise ops, reduce, concat and split give hand-checked results", "[reference]") {
  Vec a{1, 2, 3}, b{4, 5, 6}, y{1, 1, 1};
  ref(OpKind::Add, ElementwiseAttrs{3, 2.f, -1.f}, {&a, &b}, {&y});
  CHECK(y == Vec{-2, -1, 0});
  ref(OpKind::Mul, ElementwiseAttrs{3}, {&a, &b}, {&y});
  CHECK(y == Vec{4, 10, 18});
  y = {1, 1, 1};
  ref(OpKind::Axpby, ElementwiseAttrs{3, 2.f, 3.f}, {&a}, {&y});
  CHECK(y == Vec{5, 7, 9});
  ref(OpKind::Scale, ElementwiseAttrs{3, -2.f}, {&a}, {&y});
  CHECK(y == Vec{-2, -4, -6});
  ref(OpKind::Fill, ElementwiseAttrs{3, 7.f}, {}, {&y});
  CHECK(y == Vec{7, 7, 7});
  ref(OpKind::Copy, ElementwiseAttrs{3}, {&b}, {&y});
  CHECK(y == b);

  Vec x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, r(4);  // (outer 2, reduce 3, inner 2)
  ref(OpKind::ReduceSum, ReduceAttrs{2, 3, 2}, {&x}, {&r});
  CHECK(r == Vec{1 + 3 + 5, 2 + 4 + 6, 7 + 9 + 11, 8 + 10 + 12});

  ConcatAttrs c{2, 1, {1, 2}};
  Vec p0{1, 2}, p1{3, 4, 5, 6}, whole(6);
  ref(OpKind::Concat, c, {&p0, &p1}, {&whole});
  CHECK(whole == Vec{1, 3, 4, 2, 5, 6});
  Vec q0(2), q1(4);
  ref(OpKind::Split, c, {&whole}, {&q0, &q1});
  CHECK(q0 == p0);
  CHECK(q1 == p1);
}

TEST_CASE("reference split is the gradient of concat, and reduce_sum's gradient broadcasts", "[reference]") {
  ConcatAttrs c{3, 2, {2, 1, 3}};
  Vec x0 = rand_vec(12, 20), x1 = rand_vec(6, 21), x2 = rand_vec(18, 22), y(36), R = rand_vec(36, 23);
  Vec g0(12), g1(6), g2(18);
  ref(OpKind::Split, c, {&R}, {&g0, &g1, &g2});
  auto loss = [&] {
    ref(OpKind::Concat, c, {&x0, &x1, &x2}, {&y});
    return dot(y, R);
  };
  check_gradient(x0, loss, g0);
  check_gradient(x1, loss, g1);
  check_gradient(x2, loss, g2);

  ReduceAttrs r{2, 4, 3};
  Vec x = rand_vec(24, 24), s(6), Rs = rand_vec(6, 25), dx(24);
  for (int64_t o = 0; o < 2; ++o)
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t i = 0; i < 3; ++i) dx[size_t((o * 4 + k) * 3 + i)] = Rs[size_t(o * 3 + i)];
  check_gradient(
      x,
      [&] {
        ref(OpKind::ReduceSum, r, {&x}, {&s});
        return dot(s, Rs);
      },
      dx);
}

TEST_CASE("reference dropout keeps the same elements forward and backward, scaled by 1/(1-rate)", "[reference]") {
  const int64_t n = 20000;
  Vec x(n, 1.f), y(n), dy(n, 2.f), dx(n);
  DropoutAttrs a{n, 0.25f, 1234u, 7u};
  ref(OpKind::DropoutForward, a, {&x}, {&y});
  ref(OpKind::DropoutBackward, a, {&dy}, {&dx});
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_uniform(1234u, 7u, uint32_t(i)) >= 0.25f;
    REQUIRE((y[i] != 0.f) == keep);
    REQUIRE((dx[i] != 0.f) == keep);
    if (keep) {
      CHECK(y[i] == 1.f / 0.75f);
      CHECK(dx[i] == 2.f / 0.75f);
    }
    kept += keep;
  }
  CHECK(std::abs(double(kept) / n - 0.75) < 0.02);
  a.counter = 8;  // a new step draws a new mask
  Vec y2(n);
  ref(OpKind::DropoutForward, a, {&x}, {&y2});
  CHECK(y2 != y);
  a.rate = 0.f;
  ref(OpKind::DropoutForward, a, {&x}, {&y2});
  CHECK(y2 == x);
  a.rate = 1.f;
  ref(OpKind::DropoutForward, a, {&x}, {&y2});
  CHECK(y2 == Vec(n, 0.f));
}

TEST_CASE("reference optimizers follow the PyTorch formulas on hand-computed steps", "[reference]") {
  SECTION("sgd with momentum, nesterov and weight decay") {
    Vec g{1.f}, w{2.f}, v{0.5f};
    ref(OpKind::SgdUpdate, SgdAttrs{1, 0.1f, 0.9f, 0.01f, false}, {&g}, {&w, &v});
    // g' = 1.02, v = 0.45 + 1.02 = 1.47, w = 2 - 0.147
    CHECK(v[0] == Approx(1.47f));
    CHECK(w[0] == Approx(1.853f));
    w = {2.f}, v = {0.5f};
    ref(OpKind::SgdUpdate, SgdAttrs{1, 0.1f, 0.9f, 0.f, true}, {&g}, {&w, &v});
    CHECK(v[0] == Approx(1.45f));
    CHECK(w[0] == Approx(2 - 0.1 * (1 + 0.9 * 1.45)));
    w = {2.f}, v = {0.5f};
    ref(OpKind::SgdUpdate, SgdAttrs{1, 0.1f, 0.f, 0.f, false}, {&g}, {&w, &v});
    CHECK(w[0] == Approx(1.9f));
    CHECK(v[0] == 0.5f);  // untouched without momentum
  }
  SECTION("adam, two steps") {
    Vec g{0.5f}, w{1.f}, m{0.f}, v{0.f};
    AdamAttrs a{1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.f, 1};
    ref(OpKind::AdamUpdate, a, {&g}, {&w, &m, &v});
    // m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25 -> w = 1 - 0.1 * 0.5 / (0.5 + 1e-8)
    CHECK(m[0] == Approx(0.05f));
    CHECK(v[0] == Approx(0.00025f).epsilon(1e-4));  // beta2 is the float 0.999f
    CHECK(w[0] == Approx(0.9f).epsilon(1e-6));
    g = {-1.f};
    a.step = 2;
    ref(OpKind::AdamUpdate, a, {&g}, {&w, &m, &v});
    // m = 0.045 - 0.1 = -0.055, v = 0.00024975 + 0.001 = 0.00124975
    // m^ = -0.055 / 0.19 = -0.289473684, v^ = 0.00124975 / 0.001999 = 0.625187594, sqrt = 0.790688
    CHECK(m[0] == Approx(-0.055f));
    CHECK(v[0] == Approx(0.00124975f).epsilon(1e-4));
    CHECK(w[0] == Approx(0.9 + 0.1 * 0.289473684 / 0.790688).epsilon(1e-5));
  }
  SECTION("adam with L2 weight decay adds wd*w to the gradient") {
    Vec g{0.f}, w{2.f}, m{0.f}, v{0.f};
    ref(OpKind::AdamUpdate, AdamAttrs{1, 0.1f, 0.9f, 0.999f, 0.f, 0.5f, 1}, {&g}, {&w, &m, &v});
    CHECK(m[0] == Approx(0.1f));  // (1 - 0.9) * 0.5 * 2
    CHECK(w[0] == Approx(1.9f));
  }
  SECTION("rmsprop with and without momentum, and ema") {
    Vec g{2.f}, w{1.f}, sq{1.f}, buf{0.5f};
    ref(OpKind::RmspropUpdate, RmspropAttrs{1, 0.01f, 0.9f, 0.f, 0.f}, {&g}, {&w, &sq, &buf});
    CHECK(sq[0] == Approx(1.3f));  // 0.9 + 0.1 * 4
    CHECK(w[0] == Approx(1 - 0.01 * 2 / std::sqrt(1.3)));
    CHECK(buf[0] == 0.5f);
    ref(OpKind::RmspropUpdate, RmspropAttrs{1, 0.01f, 0.9f, 0.f, 0.5f}, {&g}, {&w, &sq, &buf});
    const double s2 = 0.9 * 1.3 + 0.4, b2 = 0.25 + 2 / std::sqrt(s2);
    CHECK(buf[0] == Approx(b2));
    Vec shadow{1.f}, ww{3.f};
    ref(OpKind::EmaUpdate, EmaAttrs{1, 0.75f}, {&ww}, {&shadow});
    CHECK(shadow[0] == Approx(1.5f));
  }
}

TEST_CASE("op_arity gives the documented buffer sizes and rejects bad attributes", "[reference]") {
  ConvAttrs c{2, 3, 8, 9, 4, 3, 2, 1, 1, 0, 0, 6, 8};
  auto f = op_arity(OpKind::Conv2dBackwardFilter, c);
  CHECK(f.in == std::vector<int64_t>{2 * 3 * 8 * 9, 2 * 4 * 6 * 8});
  CHECK(f.out == std::vector<int64_t>{4 * 3 * 3 * 2});
  CHECK(op_arity(OpKind::MaxPoolBackward, PoolAttrs{1, 2, 4, 4, 2, 2, 2, 2, 0, 0, 2, 2}).in ==
        std::vector<int64_t>{32, 8, 8});
  CHECK(op_arity(OpKind::SoftmaxCrossEntropy, LossAttrs{5, 3}).in == std::vector<int64_t>{15, 5});
  CHECK(op_arity(OpKind::SoftmaxCrossEntropy, LossAttrs{5, 3}).out == std::vector<int64_t>{1, 15});
  CHECK(op_arity(OpKind::Split, ConcatAttrs{2, 3, {1, 4}}).out == std::vector<int64_t>{6, 24});
  CHECK(op_arity(OpKind::AdamUpdate, AdamAttrs{7}).out.size() == 3);
  CHECK(op_arity(OpKind::Fill, ElementwiseAttrs{4}).in.empty());
  CHECK_THROWS_AS(op_arity(OpKind::Gemm, ConvAttrs{}), Error);
  CHECK_THROWS_WITH(op_arity(OpKind::Gemm, ConvAttrs{}), Catch::Contains("GemmAttrs") && Catch::Contains("ConvAttrs"));
  CHECK_THROWS_WITH(op_arity(OpKind::Gemm, GemmAttrs{-1, 2, 3}), Catch::Contains("m must be >= 0"));
  CHECK_THROWS_AS(op_arity(OpKind::Conv2dForward, ConvAttrs{1, 1, 3, 3, 1, 1, 1, 0, 1, 0, 0, 3, 3}), Error);

  std::set<std::string_view> names;
  for (int k = 0; k < int(OpKind::Count_); ++k) names.insert(op_name(OpKind(k)));
  CHECK(names.size() == size_t(OpKind::Count_));
  CHECK(names.count("unknown_op") == 0);
}

TEST_CASE("reference_op refuses the wrong number of buffers", "[reference]") {
  Vec a{1}, y{0};
  std::vector<const float*> in{a.data()};
  std::vector<float*> out{y.data()};
  CHECK_THROWS_WITH(reference_op(OpKind::Add, ElementwiseAttrs{1}, in, out),
                    Catch::Contains("add") && Catch::Contains("expected 2 inputs"));
}
