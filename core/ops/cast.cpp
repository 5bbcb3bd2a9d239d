// Cast: float32 <-> bf16/f16 storage (mixed precision). Semantics: ops.hpp.
#include "kiln/half.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

void cast_ref(const CastAttrs& a, In in, Out out) {
  for (int64_t i = 0; i < a.count; ++i) out[0][i] = round_to(in[0][i], a.to);
}

void cast_grad(GradContext& g) {
  const Node& n = g.node();
  if (!g.needs_grad(n.in[0])) return;
  const auto& a = std::get<CastAttrs>(n.attrs);
  // A parameter's 16-bit copy has its gradient in float32 already (GradContext::dtype).
  const DType from = g.dtype(g.dy()), to = g.dtype(n.in[0]);
  if (from == to)
    g.contribute(n.in[0], g.dy());
  else
    g.emit_grad(n.in[0], OpKind::Cast, CastAttrs{a.count, from, to}, {g.dy()});
}

void cast_cases(Table& t) {
  // float32 to float32 is the identity, which the gradient rule's finite differences can check.
  t.grad("30.float32", OpKind::Cast, CastAttrs{30, DType::f32, DType::f32}, {uni(-1.f, 1.f)}, {kOut},
         Check::elementwise);
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  for (DType from : types)
    for (DType to : types) {
      if (from == to) continue;
      for (int64_t n : {1, 7, 4099}) {
        OpCase& c = t.add(std::string(dtype_name(from)) + "." + dtype_name(to) + "." + str(n), OpKind::Cast,
                          CastAttrs{n, from, to}, {uni(-300.f, 300.f)}, {kOut}, Check::elementwise, true);
        c.in_dtype = {from};
        c.out_dtype = {to};
      }
    }
}

}  // namespace

KILN_CORE_OPS(cast) {
  OpDesc d = desc<CastAttrs>(
      "cast",
      [](const OpAttrs& a) -> OpArity {
        const int64_t n = counted<CastAttrs>("cast", a);
        return {{n}, {n}};
      },
      ref_of<CastAttrs, cast_ref>());
  d.grad = cast_grad;
  d.cases = cases_of(OpKind::Cast, cast_cases);
  register_op(OpKind::Cast, std::move(d));
}

}  // namespace kiln::op_impl
