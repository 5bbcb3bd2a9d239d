// An example third-party plugin: a `residual_dense` layer (y = x + act(x W + b)), a `gaussian_noise` data stage,
// and a custom op: `swish` (y = x * sigmoid(x)) with its backward op, their reference, a CPU kernel and a
// Vulkan compute shader, used by a `swish` layer. It uses only the installed SDK headers (kiln/*.hpp).
#include <algorithm>
#include <cmath>
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
    if (s.rank() != 2)
      throw ConfigError("layer '" + g.layer() + "': residual_dense expects (batch, features), got " + s.str());
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
  GaussianNoise(std::unique_ptr<Stage> up, float stddev, uint64_t seed)
      : up_(std::move(up)), stddev_(stddev), seed_(seed) {}
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

// ---- the swish op ---------------------------------------------------------------------------------------------
// swish:          in: x(count); out: y(count), y = x * sigmoid(x); y may alias x.
// swish_backward: in: x(count), dy(count); out: dx(count), dx = dy * (s + x s (1 - s)), s = sigmoid(x).
// Attributes: CustomAttrs{ints = {count}}.

OpKind g_swish{}, g_swish_backward{};

int64_t swish_count(const char* op, const OpAttrs& a) {
  const auto* c = std::get_if<CustomAttrs>(&a);
  if (!c || c->ints.size() != 1 || !c->floats.empty())
    throw Error(std::string("op ") + op + ": expects CustomAttrs{ints = {count}}");
  if (c->ints[0] < 0)
    throw Error(std::string("op ") + op + ": count must be >= 0, found " + std::to_string(c->ints[0]));
  return c->ints[0];
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void swish_forward_ref(const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
  const int64_t n = swish_count("swish", a);
  for (int64_t i = 0; i < n; ++i) out[0][i] = static_cast<float>(in[0][i] * sigmoid(in[0][i]));
}

void swish_backward_ref(const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
  const int64_t n = swish_count("swish_backward", a);
  for (int64_t i = 0; i < n; ++i) {
    const double x = in[0][i], s = sigmoid(x);
    out[0][i] = static_cast<float>(in[1][i] * (s + x * s * (1.0 - s)));
  }
}

// The CPU kernels: plain loops the compiler vectorizes (float math, as a backend would).
void swish_forward_cpu(const OpCall& c) {
  const int64_t n = std::get<CustomAttrs>(c.attrs).ints[0];
  const float* x = c.in[0].host();
  float* y = c.out[0].host();
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.f + std::exp(-x[i]));
}

void swish_backward_cpu(const OpCall& c) {
  const int64_t n = std::get<CustomAttrs>(c.attrs).ints[0];
  const float *x = c.in[0].host(), *dy = c.in[1].host();
  float* dx = c.out[0].host();
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.f / (1.f + std::exp(-x[i]));
    dx[i] = dy[i] * (s + x[i] * s * (1.f - s));
  }
}

#ifdef EXAMPLE_HAS_VULKAN_SHADERS
const std::vector<uint32_t> kSwishForwardSpv = {
#include "swish_forward.spv.inc"
};
const std::vector<uint32_t> kSwishBackwardSpv = {
#include "swish_backward.spv.inc"
};

std::array<uint32_t, 3> grid(const OpCall& c) {
  const int64_t n = std::get<CustomAttrs>(c.attrs).ints[0];
  return {static_cast<uint32_t>(std::clamp<int64_t>((n + 255) / 256, 1, 65535)), 1, 1};
}
std::vector<uint32_t> count_param(const OpCall& c) {
  return {static_cast<uint32_t>(std::get<CustomAttrs>(c.attrs).ints[0])};
}
#endif

void register_swish(Registry& reg) {
  OpDesc fwd;
  fwd.name = "swish";
  fwd.attrs_index = OpAttrs(CustomAttrs{}).index();
  fwd.arity = [](const OpAttrs& a) -> OpArity {
    const int64_t n = swish_count("swish", a);
    return {{n}, {n}};
  };
  fwd.may_alias = {{0, 0}};
  fwd.reference = swish_forward_ref;
  // The gradient rule emits the plugin's own backward op.
  fwd.grad = [](GradContext& g) {
    const Node& n = g.node();
    if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], g_swish_backward, n.attrs, {n.in[0], g.dy()});
  };
  fwd.cases = [] {
    std::vector<OpCase> v;
    for (int64_t n : {1, 7, 256, 1000, 65537}) {
      OpCase c;
      c.id = std::to_string(n);
      c.attrs = CustomAttrs{{n}, {}};
      c.in = {uni(-6.f, 6.f)};
      c.out = {kOut};
      v.push_back(c);
    }
    OpCase g;
    g.id = "grad.40";
    g.attrs = CustomAttrs{{40}, {}};
    g.in = {uni(-3.f, 3.f)};
    g.out = {kOut};
    g.gradcheck = true;
    v.push_back(g);
    OpCase inplace = v[3];
    inplace.id = "1000.inplace";
    inplace.alias = {{0, 0}};
    v.push_back(inplace);
    return v;
  };
  g_swish = reg.add_op(std::move(fwd));

  OpDesc bwd;
  bwd.name = "swish_backward";
  bwd.attrs_index = OpAttrs(CustomAttrs{}).index();
  bwd.arity = [](const OpAttrs& a) -> OpArity {
    const int64_t n = swish_count("swish_backward", a);
    return {{n, n}, {n}};
  };
  bwd.reference = swish_backward_ref;
  bwd.cases = [] {
    std::vector<OpCase> v;
    for (int64_t n : {1, 7, 1000, 65537}) {
      OpCase c;
      c.id = std::to_string(n);
      c.attrs = CustomAttrs{{n}, {}};
      c.in = {uni(-6.f, 6.f), uni(-1.f, 1.f)};
      c.out = {kOut};
      v.push_back(c);
    }
    return v;
  };
  g_swish_backward = reg.add_op(std::move(bwd));

  reg.add_kernel("cpu", g_swish, HostKernel{swish_forward_cpu});
  reg.add_kernel("cpu", g_swish_backward, HostKernel{swish_backward_cpu});
#ifdef EXAMPLE_HAS_VULKAN_SHADERS
  reg.add_kernel("vulkan", g_swish, ShaderKernel{"example.swish_forward", kSwishForwardSpv, count_param, grid});
  reg.add_kernel("vulkan", g_swish_backward,
                 ShaderKernel{"example.swish_backward", kSwishBackwardSpv, count_param, grid});
#endif
}

// y = swish(x), elementwise: any shape.
class Swish : public Layer {
 public:
  explicit Swish(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "swish"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    return g.op1(g_swish, CustomAttrs{{s.numel()}, {}}, {in[0]}, s);
  }
};

const PluginDescriptor* descriptor() {
  static const PluginDescriptor d{
      "example", "1.0.0", kApiVersion, KILN_BUILD_FINGERPRINT,
      "example third-party plugin: residual_dense and swish layers, swish op, gaussian_noise stage"};
  return &d;
}

void register_all(Registry& reg) {
  register_swish(reg);
  reg.add_layer("swish", [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Swish>(c); });
  reg.add_layer("residual_dense",
                [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<ResidualDense>(c); });
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
