// Dropout, forward and backward: the same mask from kiln's counter-based RNG (dropout_uniform, reference.hpp), which
// every backend computes bit for bit, so backward needs no saved mask. Semantics: ops.hpp.
// Also the dropout layer that emits it.
#include "kiln/reference.hpp"
#include "kiln/step.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity dropout_arity(std::string_view name, const OpAttrs& attrs) {
  const auto& a = attrs_as<DropoutAttrs>(name, attrs);
  check_dims(name, {{"count", a.count}});
  if (!(a.rate >= 0.f && a.rate <= 1.f))
    throw Error(op_label(name) + ": rate must be in [0, 1], found " + std::to_string(a.rate));
  return {{a.count}, {a.count}};
}

void dropout_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::DropoutBackward, n.attrs, {g.dy()});
}

void dropout_ref(const DropoutAttrs& a, In in, Out out) {
  for (int64_t i = 0; i < a.count; ++i) {
    const bool keep = dropout_uniform(a.seed, a.counter, static_cast<uint32_t>(i)) >= a.rate;
    out[0][i] = keep ? in[0][i] / (1.0f - a.rate) : 0.0f;
  }
}

void dropout_cases(Table& t) {
  t.grad("50.rate0.3", OpKind::DropoutForward, DropoutAttrs{50, 0.3f, 7, 3}, {uni(-1.f, 1.f)}, {kOut},
         Check::elementwise);

  struct D {
    const char* name;
    int64_t count;
    float rate;
    uint32_t seed, counter;
    bool exact;
  };
  const D cfgs[] = {{"1.rate0.5", 1, 0.5f, 1, 0, true},
                    {"257.rate0.5", 257, 0.5f, 7, 3, true},
                    {"100003.rate0.5", 100003, 0.5f, 42, 1000, true},
                    {"4099.rate0.25", 4099, 0.25f, 3, 1, false},
                    {"4099.rate0", 4099, 0.f, 5, 2, true},
                    {"4099.rate1", 4099, 1.f, 5, 2, true}};
  for (const D& d : cfgs) {
    DropoutAttrs a{d.count, d.rate, d.seed, d.counter};
    for (OpKind k : {OpKind::DropoutForward, OpKind::DropoutBackward})
      t.add(std::string(d.name) + (d.exact ? ".int" : ".float"), k, a, {d.exact ? kI : kF}, {kOut}, Check::elementwise,
            d.exact);
  }
  t.add("1000.rate0.5.inplace.int", OpKind::DropoutForward, DropoutAttrs{1000, 0.5f, 9, 9}, {kI}, {kOut},
        Check::elementwise, true)
      .alias = {{0, 0}};
  t.add("1000.rate0.5.inplace.int", OpKind::DropoutBackward, DropoutAttrs{1000, 0.5f, 9, 9}, {kI}, {kOut},
        Check::elementwise, true)
      .alias = {{0, 0}};
}

// ---- the layer ---------------------------------------------------------------------------------------------

class DropoutLayer : public Layer {
 public:
  explicit DropoutLayer(const ConfigNode& c) : rate_(static_cast<float>(c.get_float("rate"))) {
    if (!(rate_ >= 0.f && rate_ < 1.f)) c.fail("rate", "expected a number in [0, 1), found " + std::to_string(rate_));
    c.finish();
  }
  std::string type() const override { return "dropout"; }
  // Identity at evaluation; at training keeps each element with probability 1 - rate, scaled by 1/(1 - rate).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    if (!g.training() || rate_ == 0.f) return in[0];
    const Shape& s = g.shape(in[0]);
    return g.op1(OpKind::DropoutForward, DropoutAttrs{s.numel(), rate_, g.layer_seed(), 0}, {in[0]}, s);
  }

 private:
  float rate_;
};

}  // namespace

KILN_CORE_OPS(dropout) {
  for (auto [k, name] :
       {std::pair{OpKind::DropoutForward, "dropout_forward"}, std::pair{OpKind::DropoutBackward, "dropout_backward"}}) {
    OpDesc d = desc<DropoutAttrs>(
        name, [name = name](const OpAttrs& a) { return dropout_arity(name, a); }, ref_of<DropoutAttrs, dropout_ref>());
    d.may_alias = {{0, 0}};
    d.step_scalars = kStepDropoutCounter;
    d.patch = [](OpAttrs& a, const StepScalars& s) {
      std::get<DropoutAttrs>(a).counter = static_cast<uint32_t>(s.step);
    };
    if (k == OpKind::DropoutForward) d.grad = dropout_grad;
    d.cases = cases_of(k, dropout_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("dropout", factory<DropoutLayer>());
}

}  // namespace kiln::op_impl
