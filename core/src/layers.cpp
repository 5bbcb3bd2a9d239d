// The core's built-in layers. Each reads its TOML keys, then emits forward ops; shapes carry the batch dim.
#include <algorithm>
#include <cstdint>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/layer.hpp"
#include "kiln/plugin.hpp"

namespace kiln {

namespace {

[[noreturn]] void shape_error(const GraphBuilder& g, const std::string& what) {
  throw ConfigError("layer '" + g.layer() + "': " + what);
}

// Checked before a layer creates a tensor of shape `s`: a shape beyond kMaxTensorBytes (or whose element count
// overflows) is a ConfigError naming the layer, the shape and the config key (`key_where`) that made it so large.
void check_size(const GraphBuilder& g, const Shape& s, const std::string& what, const std::string& key_where) {
  if (s.fits()) return;
  std::string dims;
  for (size_t i = 0; i < s.rank(); ++i) dims += (i ? " x " : "") + std::to_string(s[i]);
  throw ConfigError("layer '" + g.layer() + "': its " + what + " would be " + dims +
                    " float32 values, more than the largest tensor Kiln plans (2^48 bytes = 256 TiB); " + key_where +
                    (what.rfind("output", 0) == 0 ? " (or [train] batch_size, the first dim)" : "") +
                    " is far too large");
}

// "linear" means none.
std::optional<std::string> read_activation(const ConfigNode& c, const std::string& key, const std::string& dflt) {
  auto a = c.get_choice(key, {"linear", "relu", "sigmoid", "tanh", "softmax"}, dflt);
  if (a == "linear") return std::nullopt;
  return a;
}

TensorId apply_activation(GraphBuilder& g, TensorId x, const std::string& act) {
  const Shape& s = g.shape(x);
  if (act == "softmax") {
    int64_t cols = s[s.rank() - 1];
    return g.op1(OpKind::SoftmaxForward, SoftmaxAttrs{s.numel() / cols, cols}, {x}, s);
  }
  Activation a = act == "relu" ? Activation::relu : act == "sigmoid" ? Activation::sigmoid : Activation::tanh;
  return g.op1(OpKind::ActivationForward, ActivationAttrs{a, s.numel()}, {x}, s);
}

class DenseLayer : public Layer {
 public:
  explicit DenseLayer(const ConfigNode& c)
      : units_(c.get_int("units")), use_bias_(c.get_bool("use_bias", true)), act_(read_activation(c, "activation", "linear")),
        where_(c.where("units")) {
    if (units_ <= 0) c.fail("units", "expected a positive integer, found " + std::to_string(units_));
    if (!Shape{units_}.fits())
      c.fail("units", "is " + std::to_string(units_) + ", more than one tensor can hold (2^46 float32 values)");
    c.finish();
  }
  std::string type() const override { return "dense"; }
  // x: (N, F) -> y: (N, units)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 2) shape_error(g, "dense expects input (batch, features), got " + s.str() + "; add a flatten layer before it");
    int64_t n = s[0], f = s[1];
    check_size(g, {f, units_}, "kernel (features, units)", where_);
    check_size(g, {n, units_}, "output (batch, units)", where_);
    TensorId w = g.param("kernel", {f, units_}, Init{InitKind::glorot_uniform, f, units_});
    TensorId y = g.op1(OpKind::Gemm, GemmAttrs{n, units_, f}, {in[0], w}, {n, units_});
    if (use_bias_) {
      TensorId b = g.param("bias", {units_}, Init{});
      y = g.op1(OpKind::BiasAdd, BiasAttrs{n, units_, 1}, {y, b}, {n, units_});
    }
    return act_ ? apply_activation(g, y, *act_) : y;
  }

 private:
  int64_t units_;
  bool use_bias_;
  std::optional<std::string> act_;
  std::string where_;  // "run.toml:12: key 'model.layers[1].units'", for size errors at build time
};

// Output size and top/left padding for "same" (TensorFlow's rule: extra padding goes bottom/right) or "valid".
// Computed in 128 bits: kernel and stride come straight from the config and may be absurdly large.
void window_geometry(bool same, int64_t in, int64_t k, int64_t stride, int64_t& out, int64_t& pad) {
  if (same) {
    out = in / stride + (in % stride != 0);
    const __int128 total = std::max<__int128>(__int128{out - 1} * stride + k - in, 0);
    pad = total / 2 > INT64_MAX / 2 ? -1 : static_cast<int64_t>(total / 2);  // -1: refused by the caller
  } else {
    out = in >= k ? (in - k) / stride + 1 : 0;
    pad = 0;
  }
}

class Conv2dLayer : public Layer {
 public:
  explicit Conv2dLayer(const ConfigNode& c)
      : filters_(c.get_int("filters")),
        kernel_(c.get_pair("kernel", {3, 3})),
        strides_(c.get_pair("strides", {1, 1})),
        same_(c.get_choice("padding", {"same", "valid"}, "valid") == "same"),
        use_bias_(c.get_bool("use_bias", true)),
        act_(read_activation(c, "activation", "linear")),
        where_(c.where("filters")) {
    if (filters_ <= 0) c.fail("filters", "expected a positive integer");
    if (!Shape{filters_}.fits())
      c.fail("filters", "is " + std::to_string(filters_) + ", more than one tensor can hold (2^46 float32 values)");
    if (kernel_.first <= 0 || kernel_.second <= 0) c.fail("kernel", "expected positive sizes");
    if (strides_.first <= 0 || strides_.second <= 0) c.fail("strides", "expected positive strides");
    c.finish();
  }
  std::string type() const override { return "conv2d"; }
  // x: (N, C, H, W) -> y: (N, filters, OH, OW)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4) shape_error(g, "conv2d expects input (batch, channels, height, width), got " + s.str());
    ConvAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.k = filters_, a.r = kernel_.first, a.s = kernel_.second;
    a.stride_h = strides_.first, a.stride_w = strides_.second;
    check_size(g, {a.k, a.c, a.r, a.s}, "kernel (filters, channels, kernel height, kernel width)", where_ + " or 'kernel'");
    window_geometry(same_, a.h, a.r, a.stride_h, a.oh, a.pad_h);
    window_geometry(same_, a.w, a.s, a.stride_w, a.ow, a.pad_w);
    if (a.oh <= 0 || a.ow <= 0 || a.pad_h < 0 || a.pad_w < 0)
      shape_error(g, "kernel " + std::to_string(a.r) + "x" + std::to_string(a.s) + " with padding \"" +
                         (same_ ? "same" : "valid") + "\" does not fit input " + s.str());
    check_size(g, {a.n, a.k, a.oh, a.ow}, "output (batch, filters, height, width)", where_);
    int64_t fan_in = a.c * a.r * a.s, fan_out = a.k * a.r * a.s;
    TensorId w = g.param("kernel", {a.k, a.c, a.r, a.s}, Init{InitKind::glorot_uniform, fan_in, fan_out});
    Shape ys{a.n, a.k, a.oh, a.ow};
    TensorId y = g.op1(OpKind::Conv2dForward, a, {in[0], w}, ys);
    if (use_bias_) {
      TensorId b = g.param("bias", {a.k}, Init{});
      y = g.op1(OpKind::BiasAdd, BiasAttrs{a.n, a.k, a.oh * a.ow}, {y, b}, ys);
    }
    return act_ ? apply_activation(g, y, *act_) : y;
  }

 private:
  int64_t filters_;
  std::pair<int64_t, int64_t> kernel_, strides_;
  bool same_, use_bias_;
  std::optional<std::string> act_;
  std::string where_;  // the `filters` key, for size errors at build time
};

class Pool2dLayer : public Layer {
 public:
  Pool2dLayer(const ConfigNode& c, bool max)
      : max_(max),
        pool_(c.get_pair("pool", {2, 2})),
        strides_(c.get_pair("strides", pool_)),
        same_(c.get_choice("padding", {"same", "valid"}, "valid") == "same") {
    if (pool_.first <= 0 || pool_.second <= 0) c.fail("pool", "expected positive sizes");
    if (strides_.first <= 0 || strides_.second <= 0) c.fail("strides", "expected positive strides");
    c.finish();
  }
  std::string type() const override { return max_ ? "max_pool2d" : "avg_pool2d"; }
  // x: (N, C, H, W) -> y: (N, C, OH, OW)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4) shape_error(g, type() + " expects input (batch, channels, height, width), got " + s.str());
    PoolAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.kh = pool_.first, a.kw = pool_.second, a.stride_h = strides_.first, a.stride_w = strides_.second;
    window_geometry(same_, a.h, a.kh, a.stride_h, a.oh, a.pad_h);
    window_geometry(same_, a.w, a.kw, a.stride_w, a.ow, a.pad_w);
    if (a.oh <= 0 || a.ow <= 0 || a.pad_h < 0 || a.pad_w < 0) shape_error(g, "pool window does not fit input " + s.str());
    return g.op1(max_ ? OpKind::MaxPoolForward : OpKind::AvgPoolForward, a, {in[0]}, {a.n, a.c, a.oh, a.ow});
  }

 private:
  bool max_;
  std::pair<int64_t, int64_t> pool_, strides_;
  bool same_;
};

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

class ActivationLayer : public Layer {
 public:
  explicit ActivationLayer(const ConfigNode& c) : act_(read_activation(c, "function", "relu")) { c.finish(); }
  std::string type() const override { return "activation"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return act_ ? apply_activation(g, in[0], *act_) : in[0];
  }

 private:
  std::optional<std::string> act_;
};

class DropoutLayer : public Layer {
 public:
  explicit DropoutLayer(const ConfigNode& c) : rate_(static_cast<float>(c.get_float("rate"))) {
    if (!(rate_ >= 0.f && rate_ < 1.f)) c.fail("rate", "expected a number in [0, 1), found " + std::to_string(rate_));
    c.finish();
  }
  std::string type() const override { return "dropout"; }
  // Identity at evaluation; at training keeps each element with probability 1 - rate, scaled by 1/(1 - rate).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    if (!g.training() || rate_ == 0.f) return in[0];
    const Shape& s = g.shape(in[0]);
    return g.op1(OpKind::DropoutForward, DropoutAttrs{s.numel(), rate_, g.layer_seed(), 0}, {in[0]}, s);
  }

 private:
  float rate_;
};

class AddLayer : public Layer {
 public:
  explicit AddLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "add"; }
  int arity() const override { return -1; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    TensorId acc = in[0];
    for (size_t i = 1; i < in.size(); ++i) {
      if (g.shape(in[i]) != g.shape(acc))
        shape_error(g, "add needs inputs of one shape, got " + g.shape(acc).str() + " and " + g.shape(in[i]).str());
      acc = g.op1(OpKind::Add, ElementwiseAttrs{g.shape(acc).numel(), 1.f, 1.f}, {acc, in[i]}, g.shape(acc));
    }
    return acc;
  }
};

class ConcatLayer : public Layer {
 public:
  explicit ConcatLayer(const ConfigNode& c) : axis_(c.get_int("axis", 0)) { c.finish(); }
  std::string type() const override { return "concat"; }
  int arity() const override { return -1; }
  // Concatenates along a per-example axis (0 = channels/features; negative counts from the end).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s0 = g.shape(in[0]);
    int64_t rank = static_cast<int64_t>(s0.rank()) - 1;
    int64_t ax = axis_ < 0 ? axis_ + rank : axis_;
    if (ax < 0 || ax >= rank) shape_error(g, "concat axis " + std::to_string(axis_) + " is out of range for " + s0.str());
    size_t d = static_cast<size_t>(ax + 1);
    ConcatAttrs a;
    int64_t total = 0;
    for (auto t : in) {
      const Shape& s = g.shape(t);
      if (s.rank() != s0.rank()) shape_error(g, "concat inputs differ in rank: " + s0.str() + " and " + s.str());
      for (size_t i = 0; i < s.rank(); ++i)
        if (i != d && s[i] != s0[i]) shape_error(g, "concat inputs differ off the axis: " + s0.str() + " and " + s.str());
      a.sizes.push_back(s[d]);
      total += s[d];
    }
    a.outer = 1;
    for (size_t i = 0; i < d; ++i) a.outer *= s0[i];
    a.inner = 1;
    for (size_t i = d + 1; i < s0.rank(); ++i) a.inner *= s0[i];
    Shape out = s0;
    out[d] = total;
    check_size(g, out, "output", "the sizes of its inputs");
    return g.op1(OpKind::Concat, a, std::vector<TensorId>(in.begin(), in.end()), out);
  }

 private:
  int64_t axis_;
};

template <class L>
LayerFactory factory() {
  return [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<L>(c); };
}

}  // namespace

void register_builtin_layers(Registry& reg) {
  reg.add_layer("dense", factory<DenseLayer>());
  reg.add_layer("conv2d", factory<Conv2dLayer>());
  reg.add_layer("max_pool2d", [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, true); });
  reg.add_layer("avg_pool2d", [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, false); });
  reg.add_layer("flatten", factory<FlattenLayer>());
  reg.add_layer("activation", factory<ActivationLayer>());
  reg.add_layer("dropout", factory<DropoutLayer>());
  reg.add_layer("add", factory<AddLayer>());
  reg.add_layer("concat", factory<ConcatLayer>());
}

}  // namespace kiln
