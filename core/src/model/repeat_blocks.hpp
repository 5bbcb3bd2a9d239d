// Blocks of layers written once and repeated ([[model.layers]] repeat = N with [[model.layers.block]] tables).
#pragma once
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "kiln/config.hpp"

namespace kiln {

// One layer table, or one repetition of a block's: the block's context ("" outside), and the block's trainable and
// learning_rate_scale, the defaults of its layers.
using AddLayer = std::function<void(const ConfigNode&, const std::string&, std::optional<bool>, std::optional<double>)>;

// A block of layers written once and repeated, as PyTorch's nn.ModuleList of identical blocks or a Keras loop:
//   [[model.layers]]
//   repeat = 4                   # i = 0, 1, 2, 3
//   [[model.layers.block]]
//   name = "h{i}_ln_1"
//   ...
// Each repetition reads a copy of every block table with the placeholders replaced in every string value, so it is
// exactly the layers written out by hand: same names (the initial values are keyed by name), same order. `prev` is
// the block's default input on entry (the layer before it) and its last layer on return; `names` the layers so far.
void expand_block(const ConfigNode& bc, std::string& prev, const std::set<std::string>& names, const AddLayer& add);

}  // namespace kiln
