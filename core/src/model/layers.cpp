// The core's built-in layers. Each reads its TOML keys, then emits forward ops; shapes carry the batch dim.
#include <algorithm>
#include <cmath>
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
  auto a = c.get_choice(key, {"linear", "relu", "sigmoid", "tanh", "softmax", "gelu", "gelu_tanh", "silu"}, dflt);
  if (a == "linear") return std::nullopt;
  return a;
}

TensorId apply_activation(GraphBuilder& g, TensorId x, const std::string& act) {
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

class DenseLayer : public Layer {
 public:
  explicit DenseLayer(const ConfigNode& c)
      : tie_(c.get_string("tie", "")),
        units_(tie_.empty() ? c.get_int("units") : c.get_int("units", 0)),
        use_bias_(c.get_bool("use_bias", true)),
        act_(read_activation(c, "activation", "linear")),
        init_std_(c.get_float("init_std", 0.0)),
        where_(c.where(tie_.empty() ? "units" : "tie")) {
    if (c.has("init_std") && (!(init_std_ > 0) || !std::isfinite(init_std_)))
      c.fail("init_std", "expected a positive, finite standard deviation (leave it out for Glorot-uniform)");
    if (c.has("init_std") && !tie_.empty())
      c.fail("init_std", "has no effect with tie: the kernel is the embedding's table");
    if (!tie_.empty() && tie_.find('.') != std::string::npos)
      c.fail("tie", "expected the name of an embedding layer (its table is shared), found '" + tie_ + "'");
    if (units_ <= 0 && (tie_.empty() || c.has("units")))
      c.fail("units", "expected a positive integer, found " + std::to_string(units_));
    if (!Shape{units_}.fits())
      c.fail("units", "is " + std::to_string(units_) + ", more than one tensor can hold (2^46 float32 values)");
    c.finish();
  }
  std::string type() const override { return "dense"; }
  // x: (N, F) -> y: (N, units); a sequence (N, T, F) -> (N, T, units), the same kernel at every position
  // (PyTorch's nn.Linear on the last dimension).
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 2 && s.rank() != 3)
      shape_error(g, "dense expects input (batch, features) or (batch, positions, features), got " + s.str() +
                         "; add a flatten layer before it");
    const int64_t f = s[s.rank() - 1], n = s.numel() / std::max<int64_t>(f, 1);
    Shape out = s;
    out[s.rank() - 1] = units_;
    TensorId y;
    int64_t units = units_;
    if (!tie_.empty()) {
      // Weight tying (nanoGPT's lm_head.weight = wte.weight): y = x table^T with the embedding's (vocab, dim) table.
      const TensorId table = g.shared_param(tie_ + ".table", "tie = \"" + tie_ + "\"");
      const Shape& ts = g.shape(table);
      if (ts.rank() != 2 || ts[1] != f)
        shape_error(g, "tie = \"" + tie_ + "\": the table is " + ts.str() + ", its width must equal this layer's " +
                           std::to_string(f) + " input features");
      if (units_ > 0 && units_ != ts[0])
        shape_error(g, "units = " + std::to_string(units_) + " but the tied table has " + std::to_string(ts[0]) +
                           " rows (leave units out with tie)");
      units = ts[0];
      out[s.rank() - 1] = units;
      check_size(g, out, "output (batch, units)", where_);
      y = g.op1(OpKind::Gemm, GemmAttrs{n, units, f, false, true}, {in[0], table}, out);
    } else {
      check_size(g, {f, units_}, "kernel (features, units)", where_);
      check_size(g, out, "output (batch, units)", where_);
      // Glorot-uniform (Keras), or N(0, init_std^2) (nanoGPT's nn.init.normal_(std=0.02)).
      TensorId w = g.param("kernel", {f, units_},
                           init_std_ > 0 ? Init{InitKind::normal, f, units_, static_cast<float>(init_std_)}
                                         : Init{InitKind::glorot_uniform, f, units_});
      y = g.op1(OpKind::Gemm, GemmAttrs{n, units_, f}, {in[0], w}, out);
    }
    if (use_bias_) {
      TensorId b = g.param("bias", {units}, Init{});
      y = g.op1(OpKind::BiasAdd, BiasAttrs{n, units, 1}, {y, b}, out);
    }
    return act_ ? apply_activation(g, y, *act_) : y;
  }

 private:
  std::string tie_;  // an embedding layer's name: its table is this layer's (transposed) kernel
  int64_t units_;
  bool use_bias_;
  std::optional<std::string> act_;
  double init_std_;    // > 0: N(0, init_std^2) kernel init instead of Glorot-uniform
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
    check_size(g, {a.k, a.c, a.r, a.s}, "kernel (filters, channels, kernel height, kernel width)",
               where_ + " or 'kernel'");
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
    if (a.oh <= 0 || a.ow <= 0 || a.pad_h < 0 || a.pad_w < 0)
      shape_error(g, "pool window does not fit input " + s.str());
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

// PyTorch's nn.GELU(approximate="none" | "tanh").
class GeluLayer : public Layer {
 public:
  explicit GeluLayer(const ConfigNode& c)
      : act_(c.get_choice("approximate", {"none", "tanh"}, "none") == "tanh" ? "gelu_tanh" : "gelu") {
    c.finish();
  }
  std::string type() const override { return "gelu"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return apply_activation(g, in[0], act_);
  }

 private:
  std::string act_;
};

class SiluLayer : public Layer {
 public:
  explicit SiluLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "silu"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    return apply_activation(g, in[0], "silu");
  }
};

// (N, C, H, W) -> (N, C): the mean of each channel's plane (Keras' GlobalAveragePooling2D, PyTorch's
// AdaptiveAvgPool2d(1) + flatten).
class GlobalAvgPoolLayer : public Layer {
 public:
  explicit GlobalAvgPoolLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "global_avg_pool2d"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4)
      shape_error(g, "global_avg_pool2d expects input (batch, channels, height, width), got " + s.str());
    PoolAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.kh = a.h, a.kw = a.w, a.stride_h = std::max<int64_t>(a.h, 1), a.stride_w = std::max<int64_t>(a.w, 1);
    a.oh = 1, a.ow = 1;
    TensorId y = g.op1(OpKind::AvgPoolForward, a, {in[0]}, {a.n, a.c, 1, 1});
    return g.reshape(y, {a.n, a.c});
  }
};

// PyTorch's nn.Embedding(vocab, dim): token ids (integers stored as floats) -> rows of a learned table, N(0,
// init_std^2) at start (PyTorch's default 1; nanoGPT uses 0.02). An id outside [0, vocab) gives a row of NaN, which the
// run's finiteness checks report.
class EmbeddingLayer : public Layer {
 public:
  explicit EmbeddingLayer(const ConfigNode& c)
      : vocab_(c.get_int("vocab")),
        dim_(c.get_int("dim")),
        std_(c.get_float("init_std", 1.0)),
        where_(c.where("vocab")) {
    if (vocab_ <= 0) c.fail("vocab", "expected a positive vocabulary size, found " + std::to_string(vocab_));
    if (vocab_ >= (int64_t{1} << 24)) c.fail("vocab", "ids travel as float32: at most 2^24 - 1 ids are exact");
    if (dim_ <= 0) c.fail("dim", "expected a positive embedding width, found " + std::to_string(dim_));
    if (!(std_ > 0) || !std::isfinite(std_)) c.fail("init_std", "expected a positive, finite standard deviation");
    c.finish();
  }
  std::string type() const override { return "embedding"; }
  // ids (N, ...) -> (N, ..., dim)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    std::vector<int64_t> od = s.dims();
    od.push_back(dim_);
    const Shape out(od);
    check_size(g, {vocab_, dim_}, "table (vocab, dim)", where_);
    check_size(g, out, "output", where_);
    TensorId table = g.param("table", {vocab_, dim_}, Init{InitKind::normal, vocab_, dim_, static_cast<float>(std_)});
    return g.op1(OpKind::EmbeddingForward, EmbeddingAttrs{s.numel(), vocab_, dim_}, {in[0], table}, out);
  }

 private:
  int64_t vocab_, dim_;
  double std_;
  std::string where_;
};

// Learned positional embeddings (GPT-2, nanoGPT's wpe): x (N, T, D) + table (T, D), the same table for every example.
class PositionalEmbeddingLayer : public Layer {
 public:
  explicit PositionalEmbeddingLayer(const ConfigNode& c) : std_(c.get_float("init_std", 1.0)) {
    if (!(std_ > 0) || !std::isfinite(std_)) c.fail("init_std", "expected a positive, finite standard deviation");
    c.finish();
  }
  std::string type() const override { return "positional_embedding"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 3)
      shape_error(g, "positional_embedding expects input (batch, positions, features), got " + s.str());
    const int64_t t = s[1], d = s[2];
    TensorId table = g.param("table", {t, d}, Init{InitKind::normal, t, d, static_cast<float>(std_)});
    return g.op1(OpKind::BiasAdd, BiasAttrs{s[0], t * d, 1}, {in[0], table}, s);
  }

 private:
  double std_;
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
    if (ax < 0 || ax >= rank)
      shape_error(g, "concat axis " + std::to_string(axis_) + " is out of range for " + s0.str());
    size_t d = static_cast<size_t>(ax + 1);
    ConcatAttrs a;
    int64_t total = 0;
    for (auto t : in) {
      const Shape& s = g.shape(t);
      if (s.rank() != s0.rank()) shape_error(g, "concat inputs differ in rank: " + s0.str() + " and " + s.str());
      for (size_t i = 0; i < s.rank(); ++i)
        if (i != d && s[i] != s0[i])
          shape_error(g, "concat inputs differ off the axis: " + s0.str() + " and " + s.str());
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

std::unique_ptr<Layer> make_attention_layer(const ConfigNode& c);  // attention_layer.cpp
void register_batch_norm_layer(Registry& reg);                     // layer_batch_norm.cpp

void register_builtin_layers(Registry& reg) {
  reg.add_layer("dense", factory<DenseLayer>());
  reg.add_layer("conv2d", factory<Conv2dLayer>());
  reg.add_layer("max_pool2d",
                [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, true); });
  reg.add_layer("avg_pool2d",
                [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, false); });
  reg.add_layer("flatten", factory<FlattenLayer>());
  reg.add_layer("activation", factory<ActivationLayer>());
  reg.add_layer("dropout", factory<DropoutLayer>());
  reg.add_layer("gelu", factory<GeluLayer>());
  reg.add_layer("silu", factory<SiluLayer>());
  register_batch_norm_layer(reg);
  reg.add_layer("embedding", factory<EmbeddingLayer>());
  reg.add_layer("positional_embedding", factory<PositionalEmbeddingLayer>());
  reg.add_layer("global_avg_pool2d", factory<GlobalAvgPoolLayer>());
  reg.add_layer("add", factory<AddLayer>());
  reg.add_layer("concat", factory<ConcatLayer>());
  reg.add_layer("attention", make_attention_layer);
}

}  // namespace kiln
