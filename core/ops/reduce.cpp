// Sum over the middle axis of (outer, reduce, inner). Semantics: ops.hpp.
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity reduce_arity(const OpAttrs& attrs) {
  const auto& a = attrs_as<ReduceAttrs>("reduce_sum", attrs);
  check_dims("reduce_sum", {{"outer", a.outer}, {"reduce", a.reduce}, {"inner", a.inner}});
  return {{product("reduce_sum", {a.outer, a.reduce, a.inner})}, {product("reduce_sum", {a.outer, a.inner})}};
}

void reduce_sum_ref(const ReduceAttrs& a, In in, Out out) {
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double acc = 0;
      for (int64_t r = 0; r < a.reduce; ++r) acc += in[0][(o * a.reduce + r) * a.inner + i];
      out[0][o * a.inner + i] = static_cast<float>(acc);
    }
}

void reduce_cases(Table& t) {
  struct R {
    int64_t outer, reduce, inner;
    bool floats, large;
  };
  const R shapes[] = {{1, 1, 1, false, false},    {3, 5, 7, true, false},     {1, 100000, 1, true, false},
                      {2, 1000, 3, false, false}, {1000, 3, 1, false, false}, {7, 257, 129, true, false},
                      {64, 64, 1, false, false},  {5, 0, 3, false, false},    {1, 4194304, 1, false, true}};
  for (const R& r : shapes) {
    const std::string v = str(r.outer) + "x" + str(r.reduce) + "x" + str(r.inner);
    ReduceAttrs a{r.outer, r.reduce, r.inner};
    t.add(v + ".int", OpKind::ReduceSum, a, {kI}, {kOut}, Check::reduction, true).large = r.large;
    if (r.floats) t.add(v + ".float", OpKind::ReduceSum, a, {kF}, {kOut}, Check::reduction, false);
  }

  // Long loops (op_support.hpp): one workgroup or one invocation per output.
  t.add("3x2097153x1.int", OpKind::ReduceSum, ReduceAttrs{3, 2097153, 1}, {kI}, {kOut}, Check::reduction, true).large =
      true;
  t.add("1x32768x1024.int", OpKind::ReduceSum, ReduceAttrs{1, 32768, 1024}, {kI}, {kOut}, Check::reduction, true)
      .large = true;
  t.add("2x70000x3.int", OpKind::ReduceSum, ReduceAttrs{2, 70000, 3}, {kI}, {kOut}, Check::reduction, true);
}

}  // namespace

KILN_CORE_OPS(reduce) {
  OpDesc d = desc<ReduceAttrs>("reduce_sum", reduce_arity, ref_of<ReduceAttrs, reduce_sum_ref>());
  d.cases = cases_of(OpKind::ReduceSum, reduce_cases);
  register_op(OpKind::ReduceSum, std::move(d));
}

}  // namespace kiln::op_impl
