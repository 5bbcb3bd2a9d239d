// An example third-party plugin: a `residual_dense` layer (y = x + act(x W + b)) and a `gaussian_noise` data stage.
// It uses only the installed SDK headers (kiln/*.hpp).
#include <kiln/config.hpp>
#include <kiln/error.hpp>
#include <kiln/plugin.hpp>
#include <random>

namespace example {

using namespace kiln;

class ResidualDense : public Layer {
 public:
  explicit ResidualDense(const ConfigNode& c) : relu_(c.get_bool("relu", true)) { c.finish(); }
  std::string type() const override { return "residual_dense"; }
  // x: (N, F) -> y: (N, F)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    if (s.rank() != 2) throw ConfigError("layer '" + g.layer() + "': residual_dense expects (batch, features), got " + s.str());
    int64_t n = s[0], f = s[1];
    TensorId w = g.param("kernel", {f, f}, Init{InitKind::glorot_uniform, f, f});
    TensorId b = g.param("bias", {f}, Init{});
    TensorId h = g.op1(OpKind::Gemm, GemmAttrs{n, f, f}, {in[0], w}, s);
    h = g.op1(OpKind::BiasAdd, BiasAttrs{n, f, 1}, {h, b}, s);
    if (relu_) h = g.op1(OpKind::ActivationForward, ActivationAttrs{Activation::relu, s.numel()}, {h}, s);
    return g.op1(OpKind::Add, ElementwiseAttrs{s.numel(), 1.f, 1.f}, {in[0], h}, s);
  }

 private:
  bool relu_;
};

// Adds N(0, stddev^2) noise to each example's features; the noise of example k in epoch e is fixed by (seed, e, k).
class GaussianNoise : public Stage {
 public:
  GaussianNoise(std::unique_ptr<Stage> up, float stddev, uint64_t seed) : up_(std::move(up)), stddev_(stddev), seed_(seed) {}
  std::string name() const override { return "gaussian_noise"; }
  std::optional<Element> next() override {
    auto e = up_->next();
    if (!e) return e;
    std::mt19937_64 rng(seed_ * 1000003u + epoch_ * 7919u + count_++);
    std::normal_distribution<float> d(0.f, stddev_);
    for (auto& v : e->x.data) v += d(rng);
    return e;
  }
  void reset(uint64_t epoch) override {
    epoch_ = epoch;
    count_ = 0;
    up_->reset(epoch);
  }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }
  StageState save() const override {
    StageState s = up_->save();
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<uint8_t>(count_ >> (8 * i)));
    return s;
  }
  void restore(const StageState& s) override {
    if (s.size() < 8) throw DataError("gaussian_noise: saved state is too short");
    count_ = 0;
    for (int i = 0; i < 8; ++i) count_ |= static_cast<uint64_t>(s[s.size() - 8 + static_cast<size_t>(i)]) << (8 * i);
    up_->restore(StageState(s.begin(), s.end() - 8));
  }

 private:
  std::unique_ptr<Stage> up_;
  float stddev_;
  uint64_t seed_, epoch_ = 0, count_ = 0;
};

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{"example", "1.0.0", kApiVersion, KILN_BUILD_FINGERPRINT,
                                  "example third-party plugin: residual_dense layer, gaussian_noise stage"};
  return &d;
}

void register_all(Registry& reg) {
  reg.add_layer("residual_dense", [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<ResidualDense>(c); });
  reg.add_stage("gaussian_noise", [](const ConfigNode& c, StageContext ctx) -> std::unique_ptr<Stage> {
    if (!ctx.upstream) throw ConfigError(c.where() + ": gaussian_noise needs an upstream stage");
    float sd = static_cast<float>(c.get_float("stddev", 0.1));
    if (!(sd >= 0)) c.fail("stddev", "expected a non-negative number");
    uint64_t seed = static_cast<uint64_t>(c.get_int("seed", static_cast<int64_t>(ctx.seed)));
    c.finish();
    return std::make_unique<GaussianNoise>(std::move(ctx.upstream), sd, seed);
  });
}

}  // namespace example

KILN_PLUGIN(example::descriptor, example::register_all)
