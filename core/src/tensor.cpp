#include "kiln/tensor.hpp"

namespace kiln {

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  if (dims_.size() == 1) s += ",";
  return s + ")";
}

}  // namespace kiln
