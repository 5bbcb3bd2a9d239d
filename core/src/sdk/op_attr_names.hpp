// The name of each OpAttrs alternative, for errors: the op table's call checks (op_table.cpp) and the op families'
// attribute checks (core/ops/op_support.hpp) both name the attributes they expected and found. Internal to
// libkiln_core; here, beside the op table, so that the op families build on the op table and not the reverse.
#pragma once
#include <iterator>
#include <variant>

#include "kiln/ops.hpp"

namespace kiln::op_impl {

inline constexpr const char* kAttrNames[] = {
    "GemmAttrs",      "BiasAttrs",        "ConvAttrs",   "PoolAttrs",      "ActivationAttrs", "SoftmaxAttrs",
    "LossAttrs",      "ElementwiseAttrs", "ReduceAttrs", "ConcatAttrs",    "DropoutAttrs",    "SgdAttrs",
    "AdamAttrs",      "RmspropAttrs",     "EmaAttrs",    "EmbeddingAttrs", "LayerNormAttrs",  "PermuteAttrs",
    "BatchNormAttrs", "CustomAttrs",      "CastAttrs"};
static_assert(std::size(kAttrNames) == std::variant_size_v<OpAttrs>, "name every OpAttrs alternative");

}  // namespace kiln::op_impl
