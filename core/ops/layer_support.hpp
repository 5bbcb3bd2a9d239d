// What the layers in the op families' files (core/ops/<family>.cpp) share, internal to libkiln_core: their shape
// and size errors, the activation a dense or conv2d layer may end with, the window geometry of conv2d and pooling,
// and the factory each registers with add_core_layer.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/layer.hpp"
#include "kiln/plugin.hpp"

namespace kiln::op_impl {

[[noreturn]] inline void shape_error(const GraphBuilder& g, const std::string& what) {
  throw ConfigError("layer '" + g.layer() + "': " + what);
}

// Checked before a layer creates a tensor of shape `s`: a shape beyond kMaxTensorBytes (or whose element count
// overflows) is a ConfigError naming the layer, the shape and the config key (`key_where`) that made it so large.
inline void check_size(const GraphBuilder& g, const Shape& s, const std::string& what, const std::string& key_where) {
  if (s.fits()) return;
  std::string dims;
  for (size_t i = 0; i < s.rank(); ++i) dims += (i ? " x " : "") + std::to_string(s[i]);
  throw ConfigError("layer '" + g.layer() + "': its " + what + " would be " + dims +
                    " float32 values, more than the largest tensor Kiln plans (2^48 bytes = 256 TiB); " + key_where +
                    (what.rfind("output", 0) == 0 ? " (or [train] batch_size, the first dim)" : "") +
                    " is far too large");
}

// "linear" means none.
inline std::optional<std::string> read_activation(const ConfigNode& c, const std::string& key,
                                                  const std::string& dflt) {
  auto a = c.get_choice(key, {"linear", "relu", "sigmoid", "tanh", "softmax", "gelu", "gelu_tanh", "silu"}, dflt);
  if (a == "linear") return std::nullopt;
  return a;
}

inline TensorId apply_activation(GraphBuilder& g, TensorId x, const std::string& act) {
  const Shape& s = g.shape(x);
  if (act == "softmax") {
    int64_t cols = s[s.rank() - 1];
    return g.op1(OpKind::SoftmaxForward, SoftmaxAttrs{s.numel() / cols, cols}, {x}, s);
  }
  Activation a = Activation::relu;
  for (int i = 0; i < kActivationCount; ++i)
    if (activation_name(static_cast<Activation>(i)) == act) a = static_cast<Activation>(i);
  return g.op1(OpKind::ActivationForward, ActivationAttrs{a, s.numel()}, {x}, s);
}

// Output size and top/left padding for "same" (TensorFlow's rule: extra padding goes bottom/right) or "valid".
// Computed in 128 bits: kernel and stride come straight from the config and may be absurdly large.
inline void window_geometry(bool same, int64_t in, int64_t k, int64_t stride, int64_t& out, int64_t& pad) {
  if (same) {
    out = in / stride + (in % stride != 0);
    const __int128 total = std::max<__int128>(__int128{out - 1} * stride + k - in, 0);
    pad = total / 2 > INT64_MAX / 2 ? -1 : static_cast<int64_t>(total / 2);  // -1: refused by the caller
  } else {
    out = in >= k ? (in - k) / stride + 1 : 0;
    pad = 0;
  }
}

template <class L>
LayerFactory factory() {
  return [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<L>(c); };
}

}  // namespace kiln::op_impl
