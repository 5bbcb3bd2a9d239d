// Pointwise activations (relu, sigmoid, tanh, gelu, gelu_tanh, silu), forward and backward. Semantics: ops.hpp.
// Also the activation, gelu and silu layers that emit them.
#include <cmath>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

void check_activation(std::string_view op, const OpAttrs& attrs) {
  const int act = static_cast<int>(std::get<ActivationAttrs>(attrs).act);
  if (act < 0 || act >= kActivationCount) throw Error(op_label(op) + ": unknown activation " + std::to_string(act));
}

// relu, sigmoid and tanh backward read the forward output y; gelu, gelu_tanh and silu the input x.
void activation_grad(GradContext& g) {
  const Node& n = g.node();
  const bool from_x = activation_backward_reads_input(std::get<ActivationAttrs>(n.attrs).act);
  if (g.needs_grad(n.in[0]))
    g.emit_grad(n.in[0], OpKind::ActivationBackward, n.attrs, {from_x ? n.in[0] : n.out[0], g.dy()});
}

void activation_ref(OpKind kind, const ActivationAttrs& a, In in, Out out) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588, kInvSqrt2 = 0.70710678118654752440,
                   kInvSqrt2Pi = 0.39894228040143267794;
  for (int64_t i = 0; i < a.count; ++i) {
    if (kind == OpKind::ActivationForward) {
      const double x = in[0][i];
      double y = 0;
      switch (a.act) {
        case Activation::relu:
          y = x < 0 ? 0.0 : x;
          break;  // NaN passes through
        case Activation::sigmoid:
          y = 1.0 / (1.0 + std::exp(-x));
          break;
        case Activation::tanh:
          y = std::tanh(x);
          break;
        case Activation::gelu:
          y = 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
          break;
        case Activation::gelu_tanh:
          y = 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
          break;
        case Activation::silu:
          y = x / (1.0 + std::exp(-x));
          break;
      }
      out[0][i] = static_cast<float>(y);
    } else {
      const double v = in[0][i], dy = in[1][i];  // v: y, or x where activation_backward_reads_input
      double dx = 0;
      switch (a.act) {
        case Activation::relu:
          dx = v > 0 ? dy : 0.0;
          break;
        case Activation::sigmoid:
          dx = dy * v * (1.0 - v);
          break;
        case Activation::tanh:
          dx = dy * (1.0 - v * v);
          break;
        case Activation::gelu:
          dx = dy * (0.5 * (1.0 + std::erf(v * kInvSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5 * v * v));
          break;
        case Activation::gelu_tanh: {
          const double t = std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v));
          dx = dy * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * v * v));
          break;
        }
        case Activation::silu: {
          const double s = 1.0 / (1.0 + std::exp(-v));
          dx = dy * s * (1.0 + v * (1.0 - s));
          break;
        }
      }
      out[0][i] = static_cast<float>(dx);
    }
  }
}

void activation_cases(Table& t) {
  // spread() inputs keep finite differences clear of relu's kink.
  for (int i = 0; i < kActivationCount; ++i) {
    const auto act = static_cast<Activation>(i);
    t.grad(std::string(activation_name(act)) + ".40", OpKind::ActivationForward, ActivationAttrs{act, 40},
           {spread(-2.f, 2.f)}, {kOut}, Check::elementwise);
  }

  const int64_t sizes[] = {1, 255, 256, 257, 4099};
  const Activation acts[] = {Activation::relu, Activation::sigmoid,   Activation::tanh,
                             Activation::gelu, Activation::gelu_tanh, Activation::silu};
  for (Activation act : acts) {
    const std::string an(activation_name(act));
    // y ranges of each activation, so backward inputs are values forward could produce; gelu, gelu_tanh and
    // silu backward read x (both tails).
    const Gen y = act == Activation::sigmoid             ? uni(0.f, 1.f)
                  : act == Activation::tanh              ? uni(-1.f, 1.f)
                  : activation_backward_reads_input(act) ? uni(-8.f, 8.f)
                                                         : uni(-2.f, 2.f);
    for (int64_t s : sizes) {
      ActivationAttrs a{act, s};
      t.add(an + "." + str(s) + ".float", OpKind::ActivationForward, a, {uni(-8.f, 8.f)}, {kOut}, Check::elementwise,
            false);
      t.add(an + "." + str(s) + ".float", OpKind::ActivationBackward, a, {y, kF}, {kOut}, Check::elementwise, false);
    }
    ActivationAttrs a{act, 1000};
    t.add(an + ".1000.inplace", OpKind::ActivationForward, a, {uni(-8.f, 8.f)}, {kOut}, Check::elementwise, false)
        .alias = {{0, 0}};
    t.add(an + ".1000.inplace", OpKind::ActivationBackward, a, {y, kF}, {kOut}, Check::elementwise, false).alias = {
        {0, 1}};
  }
  t.add("relu.4099.int", OpKind::ActivationForward, ActivationAttrs{Activation::relu, 4099}, {kI}, {kOut},
        Check::elementwise, true);
  t.add("relu.4099.int", OpKind::ActivationBackward, ActivationAttrs{Activation::relu, 4099}, {kI, kI}, {kOut},
        Check::elementwise, true);
  t.add("relu.4194305.float", OpKind::ActivationForward, ActivationAttrs{Activation::relu, 4194305}, {kF}, {kOut},
        Check::elementwise, false)
      .large = true;
}

// ---- the layers --------------------------------------------------------------------------------------------

class ActivationLayer : public Layer {
 public:
  explicit ActivationLayer(const ConfigNode& c) : act_(read_activation(c, "function", "relu")) { c.finish(); }
  std::string type() const override { return "activation"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return act_ ? apply_activation(g, in[0], *act_) : in[0];
  }

 private:
  std::optional<std::string> act_;
};

// PyTorch's nn.GELU(approximate="none" | "tanh").
class GeluLayer : public Layer {
 public:
  explicit GeluLayer(const ConfigNode& c)
      : act_(c.get_choice("approximate", {"none", "tanh"}, "none") == "tanh" ? "gelu_tanh" : "gelu") {
    c.finish();
  }
  std::string type() const override { return "gelu"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return apply_activation(g, in[0], act_);
  }

 private:
  std::string act_;
};

class SiluLayer : public Layer {
 public:
  explicit SiluLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "silu"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return apply_activation(g, in[0], "silu");
  }
};

// ONNX: Relu, Sigmoid, Tanh; silu and the gelus from elementwise nodes.
void activation_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto act = std::get<ActivationAttrs>(n.attrs).act;
  if (act == Activation::relu) {
    e.add(OnnxNode{"Relu", {e.in(g, n, 0)}, {e.out(g, n, 0)}, {}});
  } else if (act == Activation::sigmoid) {
    e.add(OnnxNode{"Sigmoid", {e.in(g, n, 0)}, {e.out(g, n, 0)}, {}});
  } else if (act == Activation::tanh) {
    e.add(OnnxNode{"Tanh", {e.in(g, n, 0)}, {e.out(g, n, 0)}, {}});
  } else if (act == Activation::silu) {
    e.add(OnnxNode{"Sigmoid", {e.in(g, n, 0)}, {e.out(g, n, 0) + "/sig"}, {}});
    e.add(OnnxNode{"Mul", {e.in(g, n, 0), e.out(g, n, 0) + "/sig"}, {e.out(g, n, 0)}, {}});
  } else if (act == Activation::gelu) {  // 0.5 x (1 + erf(x / sqrt 2))
    const std::string o = e.out(g, n, 0);
    e.add(OnnxNode{"Mul", {e.in(g, n, 0), e.constant(static_cast<float>(1 / std::sqrt(2.0)))}, {o + "/s"}, {}});
    e.add(OnnxNode{"Erf", {o + "/s"}, {o + "/erf"}, {}});
    e.add(OnnxNode{"Add", {o + "/erf", e.constant(1.f)}, {o + "/1p"}, {}});
    e.add(OnnxNode{"Mul", {e.in(g, n, 0), o + "/1p"}, {o + "/x1p"}, {}});
    e.add(OnnxNode{"Mul", {o + "/x1p", e.constant(0.5f)}, {o}, {}});
  } else if (act == Activation::gelu_tanh) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    const std::string o = e.out(g, n, 0), x = e.in(g, n, 0);
    e.add(OnnxNode{"Mul", {x, x}, {o + "/x2"}, {}});
    e.add(OnnxNode{"Mul", {o + "/x2", x}, {o + "/x3"}, {}});
    e.add(OnnxNode{"Mul", {o + "/x3", e.constant(0.044715f)}, {o + "/cx3"}, {}});
    e.add(OnnxNode{"Add", {x, o + "/cx3"}, {o + "/in"}, {}});
    e.add(OnnxNode{"Mul", {o + "/in", e.constant(static_cast<float>(std::sqrt(2.0 / M_PI)))}, {o + "/k"}, {}});
    e.add(OnnxNode{"Tanh", {o + "/k"}, {o + "/t"}, {}});
    e.add(OnnxNode{"Add", {o + "/t", e.constant(1.f)}, {o + "/1p"}, {}});
    e.add(OnnxNode{"Mul", {x, o + "/1p"}, {o + "/x1p"}, {}});
    e.add(OnnxNode{"Mul", {o + "/x1p", e.constant(0.5f)}, {o}, {}});
  } else {
    e.refuse(n, "activation " + std::string(activation_name(act)));
  }
}

}  // namespace

KILN_CORE_OPS(activation) {
  {
    OpDesc d = desc<ActivationAttrs>(
        "activation_forward",
        [](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<ActivationAttrs>("activation_forward", a);
          check_activation("activation_forward", a);
          return {{n}, {n}};
        },
        ref_of<ActivationAttrs, activation_ref>(OpKind::ActivationForward));
    d.may_alias = {{0, 0}};
    d.grad = activation_grad;
    d.cases = cases_of(OpKind::ActivationForward, activation_cases);
    register_op(OpKind::ActivationForward, std::move(d));
  }
  OpDesc d = desc<ActivationAttrs>(
      "activation_backward",
      [](const OpAttrs& a) -> OpArity {
        const int64_t n = counted<ActivationAttrs>("activation_backward", a);
        check_activation("activation_backward", a);
        return {{n, n}, {n}};
      },
      ref_of<ActivationAttrs, activation_ref>(OpKind::ActivationBackward));
  d.may_alias = {{0, 1}};
  d.cases = cases_of(OpKind::ActivationBackward, activation_cases);
  register_op(OpKind::ActivationBackward, std::move(d));
  add_core_layer("activation", factory<ActivationLayer>());
  add_core_layer("gelu", factory<GeluLayer>());
  add_core_layer("silu", factory<SiluLayer>());
  register_onnx_mapping(OpKind::ActivationForward, activation_onnx);
}

}  // namespace kiln::op_impl
