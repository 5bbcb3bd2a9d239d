// Activation names. The op names and buffer sizes that ops.hpp declares (op_name, op_arity) are lookups into the op
// table and are defined there (op_table.cpp), so the op set's vocabulary depends on nothing above it.
#include "kiln/ops.hpp"

namespace kiln {

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

}  // namespace kiln
