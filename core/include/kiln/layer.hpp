// Layers: declare parameters and emit forward ops. Registered by type name so plugins can add layers.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kiln/graph.hpp"

namespace kiln {

class ConfigNode;

class Layer {
 public:
  virtual ~Layer() = default;
  Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual std::string type() const = 0;
  // Emits the forward ops for inputs (batch dim first) and returns the output. Shape mismatches throw
  // ConfigError naming the layer and the shapes.
  virtual TensorId build(GraphBuilder& g, std::span<const TensorId> inputs) const = 0;
  // How many inputs it takes: exactly 1 for most; -1 means two or more (add, concat).
  virtual int arity() const { return 1; }
};

// Reads the layer's keys from cfg (the factory must read every key it accepts; the rest are errors).
using LayerFactory = std::function<std::unique_ptr<Layer>(const ConfigNode& cfg)>;

}  // namespace kiln
