// Op names and buffer sizes: lookups into the op table (op_table.cpp; the built-in ops' descriptors: core/ops/).
#include "kiln/ops.hpp"

#include "kiln/op_table.hpp"

namespace kiln {

std::string_view op_name(OpKind k) {
  if (!op_known(k)) return "unknown_op";
  return op_desc(k).name;
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::sigmoid:
      return "sigmoid";
    case Activation::tanh:
      return "tanh";
    case Activation::gelu:
      return "gelu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::silu:
      return "silu";
  }
  return "unknown_activation";
}

OpArity op_arity(OpKind k, const OpAttrs& a) { return op_desc(k).arity(a); }

}  // namespace kiln
