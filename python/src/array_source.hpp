// kiln.data.arrays(x, y): a source stage over NumPy buffers the Python run keeps alive, registered as stage type
// "arrays" in the registries of that run (`{ type = "arrays", id = "..." }` in [data.<which>] stages).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data.hpp"

namespace kiln::python {

// C-order float32 buffers owned by Python: x (N, example...), y (N, label...).
struct ArrayData {
  const float* x = nullptr;
  std::vector<int64_t> x_shape;
  const float* y = nullptr;
  std::vector<int64_t> y_shape;
};

// The factory of stage type "arrays" over the run's arrays, by id.
StageFactory arrays_stage_factory(std::shared_ptr<const std::map<std::string, ArrayData>> arrays);

}  // namespace kiln::python
