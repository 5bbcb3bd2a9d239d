// strategy = { type = "model_parallel" }: layers on different devices (each layer's `device`, or placement =
// "auto"), copies at device boundaries, and an optional GPipe-style pipeline of micro-batches.
#pragma once
#include "kiln/plugin.hpp"

namespace kiln::parallel {

void register_model_parallel(Registry& reg);

}  // namespace kiln::parallel
