// Per-example transforms of the map stage. Each op checks at build time that the shapes it will see fit,
// and transforms one example (batch == 0) in place; random ops draw only from the rng they are given.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "kiln/config.hpp"

namespace kiln::data {

class MapOp {
 public:
  virtual ~MapOp() = default;
  virtual std::string name() const = 0;
  virtual void apply(Element& e, CounterRng& rng) const = 0;
  // Ops that keep the example's shapes can also transform it where it lies, in a batch's row (Stage::fill): x holds
  // x_out.numel() floats, y y_out.numel(). apply() on such an op does the same to the element's data.
  virtual bool in_place() const { return false; }
  virtual void apply_row(float* x, float* y, CounterRng& rng) const {
    (void)x, (void)y, (void)rng;
    throw Error("map op " + name() + " changes the example's shape and cannot transform it in place");
  }
  // The factor of an op that only multiplies x by a constant (scale); nothing for every other op.
  virtual std::optional<float> pure_scale() const { return std::nullopt; }
  Shape x_out, y_out;  // shapes after the op
};

// Builds the op described by `cfg` (key "op" selects it) for examples of shapes x, y. Throws ConfigError
// naming the key when the op or its parameters do not fit. Calls cfg.finish(). `pipeline` is the run's pipeline
// ("train", "test" or ""): random augmentation (random_crop, flip_horizontal) is refused in "test".
std::unique_ptr<MapOp> make_map_op(const ConfigNode& cfg, const Shape& x, const Shape& y,
                                   const std::string& pipeline = "");
// The scale op without a config table (used by the "scale" stage).
std::unique_ptr<MapOp> make_scale_op(double factor, const Shape& x, const Shape& y);

}  // namespace kiln::data
