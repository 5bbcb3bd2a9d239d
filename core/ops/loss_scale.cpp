// loss_unscale: float16's dynamic loss scaling divides each parameter gradient by the step's loss scale before the
// optimizer (GradScaler.unscale_). Semantics: ops.hpp. Backends run it with their scale kernel: alpha is patched.
#include "kiln/step.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

void unscale_ref(const ElementwiseAttrs& a, In in, Out out) {
  for (int64_t i = 0; i < a.count; ++i) out[0][i] = a.alpha * in[0][i];
}

void unscale_cases(Table& t) {
  t.add("4099.alpha0.25.int", OpKind::LossUnscale, ElementwiseAttrs{4099, 0.25f}, {kI}, {kOut}, Check::elementwise,
        true);
  t.add("1000.inplace.int", OpKind::LossUnscale, ElementwiseAttrs{1000, 0.5f}, {kI}, {kOut}, Check::elementwise, true)
      .alias = {{0, 0}};
}

}  // namespace

KILN_CORE_OPS(loss_scale) {
  OpDesc d = desc<ElementwiseAttrs>(
      "loss_unscale",
      [](const OpAttrs& a) -> OpArity {
        const int64_t n = counted<ElementwiseAttrs>("loss_unscale", a);
        return {{n}, {n}};
      },
      ref_of<ElementwiseAttrs, unscale_ref>());
  d.may_alias = {{0, 0}};
  d.step_scalars = kStepLossScale;
  d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<ElementwiseAttrs>(a).alpha = 1.f / s.loss_scale; };
  d.cases = cases_of(OpKind::LossUnscale, unscale_cases);
  register_op(OpKind::LossUnscale, std::move(d));
}

}  // namespace kiln::op_impl
