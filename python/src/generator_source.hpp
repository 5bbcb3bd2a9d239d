// kiln.data.generator(fn): a source stage over a Python function that returns an iterator of (x, y) each epoch,
// registered as stage type "generator" (`{ type = "generator", id = "..." }`) in the run's registries.
#pragma once
#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <string>

#include "kiln/data.hpp"

namespace kiln::python {

struct GeneratorSpec {
  pybind11::object fn;  // fn(epoch) or fn() -> iterable of (x, y)
  bool batched = true;  // each item holds a batch (leading dim N) rather than one example
  bool takes_epoch = false;
};

// The factory of stage type "generator" over the run's functions, by id. The stages take the GIL when they call
// Python, so they may run on any thread while the GIL is released.
StageFactory generator_stage_factory(std::shared_ptr<const std::map<std::string, GeneratorSpec>> gens);

}  // namespace kiln::python
