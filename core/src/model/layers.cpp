// The flatten layer, the one built-in layer that emits no op (a view), so it has no op family's file in core/ops to
// live in; every other built-in layer lives in the file of the op family it emits. All register with add_core_layer.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "kiln/config.hpp"
#include "kiln/layer.hpp"
#include "kiln/plugin.hpp"

namespace kiln {

namespace {

class FlattenLayer : public Layer {
 public:
  explicit FlattenLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "flatten"; }
  // x: (N, ...) -> y: (N, prod(...)), a view (no copy)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    return g.reshape(in[0], {s[0], s.numel() / std::max<int64_t>(s[0], 1)});
  }
};

[[maybe_unused]] const bool flatten_registered =
    (add_core_layer("flatten",
                    [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<FlattenLayer>(c); }),
     true);

}  // namespace

}  // namespace kiln
