// Graph containers and the builder layers use.
#include "kiln/graph.hpp"

#include <algorithm>
#include <functional>

#include "kiln/error.hpp"

namespace kiln {

MemoryTag role_tag(TensorRole r) {
  switch (r) {
    case TensorRole::input:
    case TensorRole::label:
      return MemoryTag::input_data;
    case TensorRole::parameter:
    case TensorRole::ema:
    case TensorRole::buffer:
      return MemoryTag::parameters;
    case TensorRole::gradient:
      return MemoryTag::gradients;
    case TensorRole::optimizer_state:
      return MemoryTag::optimizer_state;
    default:
      return MemoryTag::activations;
  }
}

bool role_persistent(TensorRole r) {
  return r == TensorRole::parameter || r == TensorRole::optimizer_state || r == TensorRole::ema ||
         r == TensorRole::buffer;
}

TensorId Graph::add_tensor(TensorInfo t) {
  // Every tensor, from any layer (plugins included), stays below kMaxTensorBytes: the planner's sums of sizes
  // then cannot overflow. Built-in layers refuse earlier, naming their config key.
  if (!t.shape.fits())
    throw ConfigError("tensor '" + t.name + "'" + (t.layer.empty() ? "" : " of layer '" + t.layer + "'") +
                      " would have shape " + t.shape.str() +
                      ", more than the largest tensor Kiln plans (2^48 bytes = 256 TiB); a size in the config is "
                      "far too large");
  tensors_.push_back(std::move(t));
  return static_cast<TensorId>(tensors_.size() - 1);
}

TensorId Graph::add_alias(TensorId of, Shape shape, std::string layer) {
  const auto& src = tensor(of);
  if (shape.numel() != src.shape.numel())
    throw ConfigError("layer '" + layer + "': cannot view " + src.shape.str() + " as " + shape.str() +
                      " (element counts differ)");
  TensorInfo t;
  t.shape = std::move(shape);
  t.role = src.role;
  t.name = src.name.empty() ? "" : src.name + "/view";
  t.layer = std::move(layer);
  t.alias_of = root(of);
  t.device = src.device;
  t.dtype = src.dtype;
  return add_tensor(std::move(t));
}

void Graph::add_node(Node n) { nodes_.push_back(std::move(n)); }

TensorId Graph::root(TensorId id) const {
  while (tensor(id).alias_of != kNoTensor) id = tensor(id).alias_of;
  return id;
}

TensorId Graph::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].alias_of == kNoTensor && tensors_[i].name == name) return static_cast<TensorId>(i);
  return kNoTensor;
}

TensorId GraphBuilder::param(const std::string& name, Shape shape, Init init) {
  TensorInfo t;
  t.shape = std::move(shape);
  t.role = TensorRole::parameter;
  t.name = layer_ + "." + name;
  t.layer = layer_;
  t.init = init;
  t.device = device_;
  if (!param_names_.insert(t.name).second)
    throw ConfigError("duplicate parameter '" + t.name + "' (two layers named '" + layer_ + "'?)");
  return g_.add_tensor(std::move(t));
}

TensorId GraphBuilder::buffer(const std::string& name, Shape shape, Init init) {
  TensorInfo t;
  t.shape = std::move(shape);
  t.role = TensorRole::buffer;
  t.name = layer_ + "." + name;
  t.layer = layer_;
  t.init = init;
  t.device = device_;
  if (!param_names_.insert(t.name).second)
    throw ConfigError("duplicate buffer '" + t.name + "' (two layers named '" + layer_ + "'?)");
  return g_.add_tensor(std::move(t));
}

TensorId GraphBuilder::shared_param(const std::string& full_name, const std::string& key) const {
  const TensorId t = g_.find(full_name);
  if (t == kNoTensor || g_.tensor(t).role != TensorRole::parameter)
    throw ConfigError("layer '" + layer_ + "': " + key + " names parameter '" + full_name +
                      "', which no layer before this one creates");
  if (g_.tensor(t).device != device_)
    throw ConfigError("layer '" + layer_ + "': " + key + " shares '" + full_name + "' with a layer on device " +
                      std::to_string(g_.tensor(t).device) + ", this layer runs on device " + std::to_string(device_) +
                      "; tied layers must run on one device");
  return t;
}

uint32_t GraphBuilder::layer_seed() const {
  uint32_t h = seed_ ^ 0x9e3779b9u;
  for (char c : layer_) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

}  // namespace kiln
