// Placeholder while the model-parallel strategy is written.
#include "model_parallel.hpp"

namespace kiln::parallel {

void register_model_parallel(Registry&) {}

}  // namespace kiln::parallel
