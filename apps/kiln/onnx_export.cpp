// kiln export --format onnx (stub, replaced below).
#include "kiln/error.hpp"
#include "model_io.hpp"
namespace kiln::app {
std::string onnx_model(const TrainedModel&) { throw ConfigError("--format onnx: not implemented yet"); }
}  // namespace kiln::app
