// CUDA graph capture and replay of a training step: the same bits as eager execution while the learning rate,
// Adam's t and the dropout counter change every step, and an eager fallback when the step changes.
#include <random>

#include "test_cuda_support.hpp"

using namespace kiln;
namespace kc = kiln::test::cuda;

namespace {

// A two-layer classifier's training step, built from ops the way the executor binds them.
struct ToyStep {
  static constexpr int64_t N = 8, D = 16, H = 12, C = 5;
  Device& d;
  kc::DeviceBuffer x, x_alt, labels, w1, b1, w2, v1, m2, v2, shadow;  // inputs and persistent state
  kc::DeviceBuffer z, h, hd, logits, loss, dlogits, dw2, dhd, dh, dz, db1, dw1, ws;
  std::vector<OpCall> calls;
  std::vector<float> losses;

  static std::vector<float> rnd(int64_t n, uint32_t seed, float scale = 0.5f) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& e : v) e = u(g);
    return v;
  }
  static size_t f(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

  explicit ToyStep(Device& dev)
      : d(dev),
        x(dev, rnd(N * D, 1)),
        x_alt(dev, rnd(N * D, 2)),
        labels(dev, std::vector<float>{0, 1, 2, 3, 4, 0, 1, 2}),
        w1(dev, rnd(D * H, 3)),
        b1(dev, rnd(H, 4)),
        w2(dev, rnd(H * C, 5)),
        v1(dev, std::vector<float>(D * H, 0.f)),
        m2(dev, std::vector<float>(H * C, 0.f)),
        v2(dev, std::vector<float>(H * C, 0.f)),
        shadow(dev, rnd(D * H, 3)),
        z(dev, f(N * H)),
        h(dev, f(N * H)),
        hd(dev, f(N * H)),
        logits(dev, f(N * C)),
        loss(dev, f(1)),
        dlogits(dev, f(N * C)),
        dw2(dev, f(H * C)),
        dhd(dev, f(N * H)),
        dh(dev, f(N * H)),
        dz(dev, f(N * H)),
        db1(dev, f(H)),
        dw1(dev, f(D * H)),
        ws(dev, size_t{64} << 20) {
    auto op = [&](OpKind k, OpAttrs a, std::vector<BufferView> in, std::vector<BufferView> out) {
      calls.push_back(OpCall{k, std::move(a), std::move(in), std::move(out), ws.view()});
    };
    op(OpKind::Gemm, GemmAttrs{N, H, D}, {x.view(), w1.view()}, {z.view()});
    op(OpKind::BiasAdd, BiasAttrs{N, H, 1}, {z.view(), b1.view()}, {z.view()});
    op(OpKind::ActivationForward, ActivationAttrs{Activation::relu, N * H}, {z.view()}, {h.view()});
    op(OpKind::DropoutForward, DropoutAttrs{N * H, 0.25f, 42u, 0u}, {h.view()}, {hd.view()});
    op(OpKind::Gemm, GemmAttrs{N, C, H}, {hd.view(), w2.view()}, {logits.view()});
    op(OpKind::SoftmaxCrossEntropy, LossAttrs{N, C, 1.f / N, true}, {logits.view(), labels.view()},
       {loss.view(), dlogits.view()});
    op(OpKind::Gemm, GemmAttrs{H, C, N, true, false}, {hd.view(), dlogits.view()}, {dw2.view()});
    op(OpKind::Gemm, GemmAttrs{N, H, C, false, true}, {dlogits.view(), w2.view()}, {dhd.view()});
    op(OpKind::DropoutBackward, DropoutAttrs{N * H, 0.25f, 42u, 0u}, {dhd.view()}, {dh.view()});
    op(OpKind::ActivationBackward, ActivationAttrs{Activation::relu, N * H}, {h.view(), dh.view()}, {dz.view()});
    op(OpKind::BiasGrad, BiasAttrs{N, H, 1}, {dz.view()}, {db1.view()});
    op(OpKind::Gemm, GemmAttrs{D, H, N, true, false}, {x.view(), dz.view()}, {dw1.view()});
    op(OpKind::SgdUpdate, SgdAttrs{D * H, 0.f, 0.9f, 1e-4f, false}, {dw1.view()}, {w1.view(), v1.view()});
    op(OpKind::AdamUpdate, AdamAttrs{H * C, 0.f, 0.9f, 0.999f, 1e-7f, 0.f, 1}, {dw2.view()},
       {w2.view(), m2.view(), v2.view()});
    op(OpKind::SgdUpdate, SgdAttrs{H, 0.f, 0.f, 0.f, false}, {db1.view()}, {b1.view(), b1.view()});  // v aliases w
    op(OpKind::EmaUpdate, EmaAttrs{D * H, 0.9f}, {w1.view()}, {shadow.view()});
  }

  // One step: new features in, forward to the loss (read back mid-step: a segment boundary), backward, update.
  void step(int64_t s, bool graphs, uint64_t step_id, bool use_alt_input = false) {
    const float lr = 0.1f / float(1 + s);
    for (auto& c : calls) {
      if (auto* a = std::get_if<SgdAttrs>(&c.attrs)) a->lr = lr;
      if (auto* a = std::get_if<AdamAttrs>(&c.attrs)) a->lr = lr / 10, a->step = s + 1;
      if (auto* a = std::get_if<DropoutAttrs>(&c.attrs)) a->counter = static_cast<uint32_t>(s);
    }
    if (graphs) d.begin_sequence(step_id);
    x.upload(rnd(N * D, 100 + static_cast<uint32_t>(s)));
    for (size_t i = 0; i < calls.size(); ++i) {
      OpCall c = calls[i];
      if (use_alt_input && i == 0) c.in[0] = x_alt.view();
      d.run(c);
      if (i == 5) losses.push_back(loss.download()[0]);
    }
    if (graphs) d.end_sequence();
  }

  std::vector<std::vector<float>> state() const {
    return {w1.download(), b1.download(), w2.download(),    v1.download(),
            m2.download(), v2.download(), shadow.download()};
  }
};

}  // namespace

TEST_CASE("cuda graph replay of a training step gives the eager bits (skipped without a CUDA device)", "[cuda]") {
  std::string why;
  auto eager_dev = kc::device_or_reason(why);
  KILN_CUDA_SKIP_IF_NO(eager_dev, why);
  auto graph_dev = kc::device_or_reason(why);
  REQUIRE(graph_dev);
  ToyStep eager(*eager_dev), graphed(*graph_dev);
  for (int64_t s = 0; s < 6; ++s) {
    eager.step(s, false, 0);
    graphed.step(s, true, 7);
  }
  const std::string report = static_cast<const char*>(graph_dev->extension("cuda.graph_report"));
  INFO(report);
  CHECK_THAT(report, Catch::Contains("captures=1") && Catch::Contains("replays=4") && Catch::Contains("mismatches=0") &&
                         Catch::Contains("capture_failures=0"));
  CHECK(graphed.losses == eager.losses);
  CHECK(graphed.state() == eager.state());
  CHECK(eager.losses.front() != eager.losses.back());  // training moved the weights

  // The same step id with another input buffer: the replay notices, runs eagerly, and stays exact.
  eager.step(6, false, 0, true);
  graphed.step(6, true, 7, true);
  const std::string after = static_cast<const char*>(graph_dev->extension("cuda.graph_report"));
  INFO(after);
  CHECK_THAT(after, Catch::Contains("mismatches=1") && Catch::Contains("differs from the recorded step"));
  CHECK(graphed.losses == eager.losses);
  CHECK(graphed.state() == eager.state());
}
