// [model] parsing and building a step's graph (the [optimizer] table and its schedules: optimizer_spec.cpp).
#include "kiln/model.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/executor.hpp"
#include "kiln/memory_savers.hpp"
#include "kiln/plugin.hpp"
#include "repeat_blocks.hpp"

namespace kiln {

namespace {

// from_logits = false says the layer before the loss already gives probabilities. Only binary cross-entropy has a
// form for those; softmax_cross_entropy applies its own softmax (a Keras model with a softmax last layer and
// from_logits=False would train a double softmax here) and mse has no logits, so the key is refused for them
// rather than ignored.
void check_from_logits(const ConfigNode& c, const OutputSpec& o) {
  if (o.from_logits || o.loss == LossKind::binary_cross_entropy) return;
  c.fail("from_logits",
         o.loss == LossKind::softmax_cross_entropy
             ? "is false, but softmax_cross_entropy takes logits and applies the softmax itself: remove the softmax "
               "activation of the last layer and leave from_logits out (Keras' from_logits=False with a softmax last "
               "layer is this same model)"
             : "is false, but it applies to binary_cross_entropy only; mse compares the outputs as they are: leave it "
               "out");
}

LossKind parse_loss(const ConfigNode& c, const std::string& key) {
  auto l = c.get_choice(key, {"softmax_cross_entropy", "sparse_softmax_cross_entropy", "mse", "binary_cross_entropy"},
                        "softmax_cross_entropy");
  if (l == "mse") return LossKind::mse;
  if (l == "binary_cross_entropy") return LossKind::binary_cross_entropy;
  return LossKind::softmax_cross_entropy;
}

}  // namespace

DType parse_dtype(const ConfigNode& c, const std::string& key) {
  const std::string v = c.get_choice(key, {"float32", "bfloat16", "float16"}, "float32");
  return v == "bfloat16" ? DType::bf16 : v == "float16" ? DType::f16 : DType::f32;
}

std::vector<DType> ModelSpec::compute_types() const {
  std::vector<DType> out;
  auto add = [&](DType t) {
    if (t != DType::f32 && std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  for (const auto& l : layers) add(l.precision.value_or(precision.compute));
  return out;
}

PrecisionSpec parse_precision(const ConfigNode& p) {
  PrecisionSpec s;
  s.compute = parse_dtype(p, "compute");
  const std::string scaling =
      p.get_choice("loss_scale", {"dynamic", "none"}, s.compute == DType::f16 ? "dynamic" : "none");
  s.loss_scaling = scaling == "dynamic";
  if (s.loss_scaling && s.compute != DType::f16)
    p.fail("loss_scale", std::string("dynamic loss scaling is for float16 (5 exponent bits); ") +
                             dtype_name(s.compute) + " has float32's exponent range and needs none: remove loss_scale");
  if (!s.loss_scaling)
    for (const char* k : {"init_scale", "growth_factor", "backoff_factor", "growth_interval"})
      if (p.has(k)) p.fail(k, "only used with loss_scale = \"dynamic\" (compute = \"float16\")");
  s.init_scale = p.get_float("init_scale", 65536.0);
  if (!(s.init_scale >= 1.0 && s.init_scale <= 1e38)) p.fail("init_scale", "expected a number in [1, 1e38]");
  s.growth_factor = p.get_float("growth_factor", 2.0);
  if (!(s.growth_factor > 1.0 && s.growth_factor <= 1e6)) p.fail("growth_factor", "expected a number > 1");
  s.backoff_factor = p.get_float("backoff_factor", 0.5);
  if (!(s.backoff_factor > 0.0 && s.backoff_factor < 1.0)) p.fail("backoff_factor", "expected a number in (0, 1)");
  s.growth_interval = p.get_int("growth_interval", 2000);
  if (s.growth_interval < 1) p.fail("growth_interval", "expected a step count >= 1");
  p.finish();
  return s;
}

ModelSpec parse_model(const ConfigNode& model, const Registry& reg) {
  ModelSpec m;
  auto in = model.get_int_list("input_shape");
  if (in.empty()) model.fail("input_shape", "expected at least one dimension, e.g. [784] or [1, 28, 28]");
  for (auto d : in)
    if (d <= 0) model.fail("input_shape", "every dimension must be positive");
  m.input_shape = Shape(in);
  if (!m.input_shape.fits())
    model.fail("input_shape",
               "is " + m.input_shape.str() + ", more values per example than one tensor can hold (2^46)");
  auto tables = model.table_array("layers");
  if (tables.empty()) model.fail("layers", "the model has no layers; add [[model.layers]] tables");
  std::set<std::string> names{"input"};
  std::map<std::string, std::string> name_block;  // a block layer's name -> its repetition, for name clashes
  std::map<std::string, int> counters;
  std::string prev = "input";
  // One layer table (or one repetition of a block's table): `block` says which, for its errors.
  auto add_layer = [&](const ConfigNode& lc, const std::string& block, std::optional<bool> trainable,
                       std::optional<double> lr_scale) {
    LayerSpec s;
    s.block = block;
    s.type = lc.get_string("type");
    if (!reg.has_layer(s.type)) {
      std::string known;
      for (auto& n : reg.layer_names()) known += (known.empty() ? "" : ", ") + n;
      lc.fail("type", "unknown layer type \"" + s.type + "\"; known: " + known);
    }
    s.name = lc.get_string("name", s.type + "_" + std::to_string(++counters[s.type]));
    if (names.count(s.name)) {
      auto it = name_block.find(s.name);
      lc.fail("name", "duplicate layer name \"" + s.name + "\"" +
                          (it != name_block.end() ? " (first made by " + it->second + ")" : "") +
                          (block.empty() ? "" : ": a layer of a repeated block needs {i} in its name (\"h{i}_attn\")"));
    }
    s.inputs = lc.get_string_list("inputs", {prev});
    for (const auto& i : s.inputs)
      if (!names.count(i))
        lc.fail("inputs",
                "\"" + i + "\" is not an earlier layer (layers are listed in order; \"input\" is the model input" +
                    (block.empty() ? ")" : "; {prev} is the block's input, the previous repetition's last layer)"));
    s.device = lc.get_string("device", "");
    if (lc.has("precision")) s.precision = parse_dtype(lc, "precision");
    s.trainable = lc.get_bool("trainable", trainable.value_or(true));
    const double scale = lc.get_float("learning_rate_scale", lr_scale.value_or(1.0));
    if (!(scale >= 0 && scale <= 1e6))
      lc.fail("learning_rate_scale",
              "expected a number in [0, 1e6] multiplying the optimizer's learning rate for this layer's parameters "
              "(1: the rate itself; 0: the weights stay, though gradients and optimizer state are still kept: "
              "trainable = false saves them), found " +
                  std::to_string(scale));
    s.lr_scale = static_cast<float>(scale);
    if (!s.trainable && lc.has("learning_rate_scale"))
      lc.fail("learning_rate_scale", "is set, but the layer has trainable = false: a frozen layer has no updates");
    s.layer = reg.layer(s.type)(lc);  // reads the layer's own keys and rejects unknown ones
    s.config = std::make_shared<const ConfigNode>(lc);
    int ar = s.layer->arity();
    if (ar > 0 && static_cast<int>(s.inputs.size()) != ar)
      lc.fail("inputs", "layer type " + s.type + " takes " + std::to_string(ar) + " input(s), got " +
                            std::to_string(s.inputs.size()));
    if (ar < 0 && s.inputs.size() < 2) lc.fail("inputs", "layer type " + s.type + " takes two or more inputs");
    names.insert(s.name);
    if (!block.empty()) name_block[s.name] = block;
    prev = s.name;
    m.layers.push_back(std::move(s));
  };
  for (auto& lc : tables) {
    if (!lc.has("repeat") && !lc.has("block")) {
      add_layer(lc, "", std::nullopt, std::nullopt);
      continue;
    }
    expand_block(lc, prev, names, add_layer);
  }
  auto outs = model.table_array("outputs");
  if (outs.empty()) {
    OutputSpec o;
    o.layer = m.layers.back().name;
    o.loss = parse_loss(model, "loss");
    o.from_logits = model.get_bool("from_logits", true);
    check_from_logits(model, o);
    m.outputs.push_back(o);
  } else {
    if (model.has("loss")) model.fail("loss", "give the loss inside each [[model.outputs]] when outputs are listed");
    for (auto& oc : outs) {
      OutputSpec o;
      o.layer = oc.get_string("layer");
      if (!names.count(o.layer) || o.layer == "input")
        oc.fail("layer", "\"" + o.layer + "\" is not a layer of the model");
      o.loss = parse_loss(oc, "loss");
      o.weight = static_cast<float>(oc.get_float("weight", 1.0));
      o.from_logits = oc.get_bool("from_logits", true);
      check_from_logits(oc, o);
      o.label = oc.get_string("label", "");
      oc.finish();
      m.outputs.push_back(o);
    }
  }
  model.finish();
  // Named labels (Keras' dict of targets): all heads name theirs, or none does.
  for (size_t i = 0; i < m.outputs.size(); ++i)
    if (m.outputs[i].label.empty() != m.outputs[0].label.empty()) {
      const size_t named = m.outputs[i].label.empty() ? 0 : i, unnamed = m.outputs[i].label.empty() ? i : 0;
      outs[unnamed].fail("label", "output '" + m.outputs[unnamed].layer + "' names no label, but output '" +
                                      m.outputs[named].layer + "' has label = \"" + m.outputs[named].label +
                                      "\": when one output names its label, every output must");
    }
  // A layer whose output nothing reads (no later layer lists it in `inputs` and it is not a model output) would be
  // computed and planned for nothing: a DAG wired by mistake.
  std::set<std::string> consumed;
  for (const auto& l : m.layers) consumed.insert(l.inputs.begin(), l.inputs.end());
  for (const auto& o : m.outputs) consumed.insert(o.layer);
  for (size_t i = 0; i < m.layers.size(); ++i)
    if (!consumed.count(m.layers[i].name))
      throw ConfigError(
          m.layers[i].config->where() + ": layer \"" + m.layers[i].name + "\" (type " + m.layers[i].type +
          "): nothing uses its output: no later layer lists it in inputs and it is not a model output " +
          (outs.empty() ? "(the last layer, \"" + m.layers.back().name + "\", is)" : "(see [[model.outputs]])") +
          "; remove the layer, list it in a later layer's inputs, or add it as an output" +
          (m.layers[i].block.empty() ? "" : " (" + m.layers[i].block + ")"));
  return m;
}

namespace {

TensorId add_state(Graph& g, TensorId param, const std::string& suffix, TensorRole role) {
  const auto& p = g.tensor(param);
  TensorInfo t;
  t.shape = p.shape;
  t.role = role;
  t.name = p.name + "/" + suffix;
  t.layer = p.layer;
  t.device = p.device;
  return g.add_tensor(std::move(t));
}

void append_updates(Graph& g, const OptimizerSpec& o, const ModelSpec& m) {
  std::map<std::string, float> scale;  // learning_rate_scale by layer; a tied weight is its creator's
  for (const auto& l : m.layers) scale[l.name] = l.lr_scale;
  for (auto [param, grad] : std::vector(g.param_grads)) {
    const auto pinfo = g.tensor(param);
    const auto sc = scale.find(pinfo.layer);
    const float lr_scale = sc == scale.end() ? 1.f : sc->second;
    int64_t count = pinfo.shape.numel();
    Node n;
    n.layer = pinfo.layer;
    n.device = pinfo.device;
    n.phase = Phase::update;
    n.in = {grad};
    n.out = {param};
    float lr = static_cast<float>(o.lr), wd = static_cast<float>(o.weight_decay);
    if (o.decay_params == DecayParams::matrices && pinfo.shape.rank() < 2) wd = 0.f;  // biases, norm scales
    switch (o.kind) {
      case OptimizerKind::sgd:
        n.kind = OpKind::SgdUpdate;
        n.attrs = SgdAttrs{count, lr * lr_scale, static_cast<float>(o.momentum), wd, o.nesterov, lr_scale};
        n.out.push_back(o.momentum > 0 ? add_state(g, param, "momentum", TensorRole::optimizer_state) : param);
        break;
      case OptimizerKind::adam:
      case OptimizerKind::adamw: {
        const bool decoupled = o.kind == OptimizerKind::adamw;
        n.kind = OpKind::AdamUpdate;
        n.attrs = AdamAttrs{count,
                            lr * lr_scale,
                            static_cast<float>(o.beta1),
                            static_cast<float>(o.beta2),
                            static_cast<float>(o.eps),
                            decoupled ? 0.f : wd,
                            1,
                            decoupled ? wd : 0.f,
                            lr_scale};
        n.out.push_back(add_state(g, param, "adam_m", TensorRole::optimizer_state));
        n.out.push_back(add_state(g, param, "adam_v", TensorRole::optimizer_state));
        break;
      }
      case OptimizerKind::rmsprop:
        n.kind = OpKind::RmspropUpdate;
        n.attrs = RmspropAttrs{count,
                               lr * lr_scale,
                               static_cast<float>(o.rho),
                               static_cast<float>(o.eps),
                               static_cast<float>(o.momentum),
                               lr_scale};
        n.out.push_back(add_state(g, param, "rms_sq", TensorRole::optimizer_state));
        n.out.push_back(o.momentum > 0 ? add_state(g, param, "rms_buf", TensorRole::optimizer_state) : param);
        break;
    }
    g.add_node(std::move(n));
    if (o.ema_decay > 0) {
      Node e;
      e.kind = OpKind::EmaUpdate;
      e.attrs = EmaAttrs{count, static_cast<float>(o.ema_decay), o.ema_warmup, static_cast<float>(o.ema_decay)};
      e.in = {param};
      e.out = {add_state(g, param, "ema", TensorRole::ema)};
      e.layer = pinfo.layer;
      e.device = pinfo.device;
      e.phase = Phase::update;
      g.add_node(std::move(e));
    }
  }
}

// A node of the global gradient passes below (one input, one output, ElementwiseAttrs).
void add_grad_node(Graph& g, OpKind k, ElementwiseAttrs a, TensorId in, TensorId out, const std::string& layer, int dev,
                   Phase phase) {
  Node n;
  n.kind = k;
  n.attrs = a;
  n.in = {in};
  n.out = {out};
  n.layer = layer;
  n.device = dev;
  n.phase = phase;
  g.add_node(std::move(n));
}

// The device every parameter lives on: the global passes below sum over all gradients on one device. `refusal`
// says why several devices cannot be (model_parallel).
int params_device(const Graph& g, const std::string& refusal) {
  const int dev = g.tensor(g.param_grads.front().first).device;
  for (auto [param, grad] : g.param_grads)
    if (g.tensor(param).device != dev) throw ConfigError(refusal);
  return dev;
}

// grad_sq = the sum of every gradient's squares, accumulated in one (1) tensor by nodes of `phase`.
void append_grad_sq(Graph& g, int dev, Phase phase, const std::string& layer) {
  TensorInfo t;
  t.shape = Shape{1};
  t.role = TensorRole::activation;
  t.layer = layer;
  t.name = "grad_norm_sq";
  t.device = dev;
  g.grad_sq = g.add_tensor(std::move(t));
  bool first = true;
  for (auto [param, grad] : g.param_grads) {
    add_grad_node(g, OpKind::SumSquares, ElementwiseAttrs{g.tensor(param).shape.numel(), 1.f, first ? 0.f : 1.f}, grad,
                  g.grad_sq, g.tensor(param).layer, dev, phase);
    first = false;
  }
}

// float16's dynamic loss scaling: every parameter gradient divided by the scale in place, then the sum of their
// squares in grad_sq (unscale phase), which the runner reads: a step with a non-finite gradient runs no update node.
// Clipping, if any, reuses grad_sq (its sums are not emitted again).
void append_unscale(Graph& g) {
  if (g.param_grads.empty()) return;
  const int dev = params_device(
      g,
      "[precision] loss_scale = \"dynamic\": the parameters live on several devices (model_parallel), and the "
      "check for non-finite gradients runs on one; use bfloat16 (no loss scaling) or the single strategy");
  g.loss_scaling = true;
  for (auto [param, grad] : g.param_grads)
    add_grad_node(g, OpKind::LossUnscale, ElementwiseAttrs{g.tensor(param).shape.numel(), 1.f, 0.f}, grad, grad,
                  g.tensor(param).layer, dev, Phase::unscale);
  append_grad_sq(g, dev, Phase::unscale, "loss_scale");
}

// torch.nn.utils.clip_grad_norm_ before the optimizer: s = sum of every gradient's squares (accumulated in one
// (1) tensor), then every gradient *= min(1, clip / (sqrt(s) + 1e-6)). Update-phase nodes, so a data-parallel
// runner clips the all-reduced gradient.
void append_clip(Graph& g, double clip) {
  if (g.param_grads.empty()) return;
  const int dev =
      params_device(g,
                    "[optimizer] clip_norm: the parameters live on several devices (model_parallel), and the global "
                    "gradient norm is computed on one; remove clip_norm or use the single or data_parallel strategy");
  // Loss scaling's unscale phase summed the squares already.
  if (g.grad_sq == kNoTensor) append_grad_sq(g, dev, Phase::update, "clip_norm");
  auto node = [&](OpKind k, ElementwiseAttrs a, TensorId in, TensorId out, const std::string& layer) {
    add_grad_node(g, k, a, in, out, layer, dev, Phase::update);
  };
  for (auto [param, grad] : g.param_grads)
    node(OpKind::ClipByGlobalNorm, ElementwiseAttrs{g.tensor(param).shape.numel(), static_cast<float>(clip), 0.f},
         g.grad_sq, grad, g.tensor(param).layer);
}

// Named labels: the label tensor (N, L) holds one value per name; a Split gives each name its (N) column (for L = 1
// the label itself). Columns no output reads are split off all the same (a few bytes each).
std::vector<TensorId> split_named_labels(Graph& g, const ModelSpec& m, int64_t nb) {
  const auto L = static_cast<int64_t>(m.label_names.size());
  if (L == 0)
    throw ConfigError("output '" + m.outputs[0].layer + "' has label = \"" + m.outputs[0].label +
                      "\", but the training data names no labels: give the source several named label columns (the csv "
                      "source's label = [\"" +
                      m.outputs[0].label + "\", ...]) or remove label from [[model.outputs]]");
  const int dev = g.tensor(g.label).device;
  if (L == 1) return {g.add_alias(g.label, Shape{nb}, "label")};
  Node n;
  n.kind = OpKind::Split;
  n.attrs = ConcatAttrs{nb, 1, std::vector<int64_t>(static_cast<size_t>(L), 1)};
  n.in = {g.label};
  n.layer = "label";
  n.device = dev;
  for (const auto& name : m.label_names) {
    TensorInfo t;
    t.shape = Shape{nb, 1};
    t.layer = "label";
    t.name = "label/" + name;
    t.device = dev;
    n.out.push_back(g.add_tensor(std::move(t)));
  }
  std::vector<TensorId> cols = n.out;
  g.add_node(std::move(n));
  for (auto& c : cols) c = g.add_alias(c, Shape{nb}, "label");
  return cols;
}

// The target of an output that names its label: that label's column, as class indices (softmax_cross_entropy over
// (N, classes) logits) or as the one target of a one-unit mse / binary_cross_entropy output.
TensorId named_target(Graph& g, const ModelSpec& m, const OutputSpec& out, const std::vector<TensorId>& cols,
                      const Shape& ys, int64_t nb) {
  auto it = std::find(m.label_names.begin(), m.label_names.end(), out.label);
  if (it == m.label_names.end()) {
    std::string known;
    for (const auto& n : m.label_names) known += (known.empty() ? "\"" : ", \"") + n + "\"";
    throw ConfigError("output '" + out.layer + "' has label = \"" + out.label + "\", but the data's labels are " +
                      known);
  }
  const TensorId col = cols[static_cast<size_t>(it - m.label_names.begin())];
  if (out.loss == LossKind::softmax_cross_entropy) {
    if (ys.rank() != 2)
      throw ConfigError("output '" + out.layer + "' (label \"" + out.label +
                        "\"): a named label is one class index per "
                        "example, so its softmax_cross_entropy needs (batch, classes) logits, got " +
                        ys.str());
    return col;
  }
  if (ys.numel() != nb)
    throw ConfigError("output '" + out.layer + "' (label \"" + out.label + "\") gives " + ys.tail().str() +
                      " per example, but a named label is one value: give it one unit");
  return ys == g.tensor(col).shape ? col : g.add_alias(col, ys, out.layer);
}

// The input tensor: a batch of [model] input_shape examples.
void add_input(Graph& g, const ModelSpec& m, int64_t batch) {
  TensorInfo in;
  in.shape = m.input_shape.with_batch(batch);
  if (!in.shape.fits())
    throw ConfigError("the input batch " + in.shape.str() + " ([train] batch_size = " + std::to_string(batch) +
                      " examples of [model] input_shape " + m.input_shape.str() +
                      ") is more than the largest tensor Kiln plans (2^48 bytes = 256 TiB); lower [train] batch_size");
  in.role = TensorRole::input;
  in.name = "input";
  g.input = g.add_tensor(in);
}

// A layer's error found while the graph builds (a value that does not fit the shapes, e.g. heads = 5 for a width of
// 32), prefixed with where the layer is configured: the key the message starts with ("heads = 5 ..."), else the
// layer's table. Messages that already name the table are left as they are.
std::string located_layer_error(const LayerSpec& l, const std::string& what) {
  if (!l.config || what.find("'" + l.config->path()) != std::string::npos) return what;
  const std::string own = "layer '" + l.name + "': ";
  std::string rest = what.rfind(own, 0) == 0 ? what.substr(own.size()) : what;
  size_t k = 0;
  while (k < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[k])) || rest[k] == '_')) ++k;
  const std::string key = k > 0 && rest.compare(k, 3, " = ") == 0 ? rest.substr(0, k) : std::string();
  const std::string at = !key.empty() && l.config->has(key) ? l.config->where(key) : l.config->where();
  return at + ": layer '" + l.name + "' (type = \"" + l.type + "\"): " + rest;
}

// trainable = false, once every layer is built (a later layer may tie to a frozen one's weight and then shares a
// frozen tensor, as a tied nn.Parameter with requires_grad False is frozen for both its uses): the frozen layers'
// parameters become buffers, so autodiff gives them no gradient (and keeps nothing alive for one), the optimizer no
// state and no update, while checkpoints, evaluation and export still hold them. A batch norm in a frozen layer
// normalizes with its running statistics and leaves them alone (Keras' trainable = False on BatchNormalization, a
// PyTorch backbone in eval()). `nodes[k]` is where layer k's nodes begin.
void freeze_layers(Graph& g, const ModelSpec& m, const std::vector<size_t>& nodes) {
  std::map<std::string, const LayerSpec*> by_name;
  for (const auto& l : m.layers) by_name[l.name] = &l;
  auto frozen = [&](const std::string& layer) {
    auto it = by_name.find(layer);
    return it != by_name.end() && !it->second->trainable;
  };
  // A 16-bit layer reads a weight through a cast, which an earlier layer may have made (one per graph).
  std::map<TensorId, TensorId> cast_of;
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::Cast) cast_of[g.root(n.out[0])] = g.root(n.in[0]);
  for (size_t k = 0; k < m.layers.size(); ++k) {
    const LayerSpec& l = m.layers[k];
    if (l.trainable) continue;
    const size_t end = k + 1 < nodes.size() ? nodes[k + 1] : g.nodes().size();
    for (size_t i = nodes[k]; i < end; ++i) {
      Node& n = g.nodes()[i];
      if (auto* a = std::get_if<BatchNormAttrs>(&n.attrs); a && n.kind == OpKind::BatchNormForward)
        a->training = false, a->sync = false;
      for (auto t : n.in) {
        const auto c = cast_of.find(g.root(t));
        const TensorInfo& p = g.tensor(c != cast_of.end() ? c->second : g.root(t));
        if (p.role == TensorRole::parameter && p.layer != l.name && !frozen(p.layer)) {
          const std::string at = l.config ? l.config->where("trainable") + ": " : std::string();
          throw ConfigError(
              at + "layer '" + l.name + "' has trainable = false, but it uses parameter '" + p.name + "' of layer '" +
              p.layer + "', which trains (a tied weight is one tensor): set trainable = false on '" + p.layer +
              "' as well, or leave '" + l.name + "' trainable" + (l.block.empty() ? "" : " [" + l.block + "]"));
        }
      }
    }
  }
  std::vector<bool> freeze(g.tensors().size(), false);
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const TensorInfo& r = g.tensor(g.root(static_cast<TensorId>(t)));
    freeze[t] = r.role == TensorRole::parameter && frozen(r.layer);
  }
  for (size_t t = 0; t < freeze.size(); ++t)
    if (freeze[t]) g.tensor(static_cast<TensorId>(t)).role = TensorRole::buffer;
}

// Every layer in order, each reading its inputs' outputs. Returns each layer's output by name ("input": the input).
std::map<std::string, TensorId> add_layers(Graph& g, const ModelSpec& m, const GraphOptions& o) {
  GraphBuilder b(g, o.batch, o.training, m.seed);
  std::map<std::string, TensorId> outs{{"input", g.input}};
  std::vector<size_t> nodes;  // where each layer's nodes begin
  bool any_frozen = false;
  for (const auto& l : m.layers) {
    b.begin_layer(l.name, o.place ? o.place(l) : 0);
    b.set_compute(l.precision.value_or(m.precision.compute));
    std::vector<TensorId> ins;
    for (const auto& i : l.inputs) ins.push_back(outs.at(i));
    TensorId y = kNoTensor;
    nodes.push_back(g.nodes().size());
    try {
      y = l.layer->build(b, ins);
    } catch (const ConfigError& e) {
      throw ConfigError(located_layer_error(l, e.what()) + (l.block.empty() ? "" : " [" + l.block + "]"));
    }
    outs[l.name] = y;
    g.layer_outputs.push_back({l.name, l.type, y});
    any_frozen = any_frozen || !l.trainable;
  }
  if (any_frozen && o.apply_trainable) freeze_layers(g, m, nodes);
  return outs;
}

// Evaluation reads the moving averages in place of the weights.
void read_ema_weights(Graph& g) {
  for (size_t t = 0; t < g.tensors().size(); ++t)
    if (g.tensors()[t].role == TensorRole::parameter) {
      auto& ti = g.tensor(static_cast<TensorId>(t));
      ti.role = TensorRole::ema;
      ti.name += "/ema";
    }
}

// The layout of the one label tensor every head reads.
struct LabelLayout {
  bool named = false;   // the outputs name their labels: one value per name
  bool any_ce = false;  // some head is a classifier (softmax_cross_entropy)
  bool soft = false;    // one value per class (one-hot or class probabilities), not class indices
  Shape ce_logits;      // the first classifier's logits, which decide the labels' layout
};

// Labels: class indices when any head is a classifier, else targets shaped like the first head's output. A
// classifier's logits are (N, classes), or (N, T, classes) for a sequence (a class per position, nanoGPT's per-token
// targets): the labels are then (N) or (N, T) class indices, or one value per class (one-hot, from the one_hot map
// op, or class probabilities) when the data's labels are that wide. Every classifier must agree with the first.
LabelLayout label_layout(const Graph& g, const ModelSpec& m, const std::map<std::string, TensorId>& outs, int64_t nb) {
  LabelLayout ll;
  ll.named = !m.outputs.empty() && !m.outputs[0].label.empty();
  for (const auto& out : m.outputs) ll.any_ce = ll.any_ce || out.loss == LossKind::softmax_cross_entropy;
  for (const auto& out : m.outputs) {
    if (ll.named || out.loss != LossKind::softmax_cross_entropy) continue;
    const Shape& ys = g.tensor(outs.at(out.layer)).shape;
    if (ys.rank() < 2)
      throw ConfigError("output '" + out.layer +
                        "': softmax_cross_entropy needs (batch, classes) or (batch, positions, "
                        "classes) logits, got " +
                        ys.str());
    const int64_t classes = ys[ys.rank() - 1], positions = ys.numel() / nb / std::max<int64_t>(classes, 1);
    const int64_t labels = m.label_shape.numel();
    const bool given = !m.label_shape.dims().empty() || positions > 1;
    std::vector<int64_t> pos_dims(ys.dims().begin() + 1, ys.dims().end() - 1);
    const Shape idx_shape(pos_dims);  // () for one class per example, (T) for a sequence
    if (ll.ce_logits.dims().empty()) {
      ll.ce_logits = ys;
      ll.soft = given && labels == positions * classes && labels != positions;
      if (given && !m.label_shape.dims().empty() && labels != positions && !ll.soft)
        throw ConfigError("the data's labels have shape " + m.label_shape.str() + " per example, but output '" +
                          out.layer + "' (softmax_cross_entropy) has " + std::to_string(classes) + " classes" +
                          (positions > 1 ? " at each of " + std::to_string(positions) + " positions" : "") +
                          ": expected class indices (shape " + idx_shape.str() + ") or " + std::to_string(classes) +
                          " class probabilities per position (shape " + ys.tail().str() +
                          ", e.g. from the one_hot map op)");
    } else if (ll.ce_logits.numel() / ll.ce_logits[ll.ce_logits.rank() - 1] != positions * nb ||
               (ll.soft && ll.ce_logits[ll.ce_logits.rank() - 1] != classes)) {
      throw ConfigError("output '" + out.layer + "' (softmax_cross_entropy, logits " + ys.str() +
                        ") cannot share the data's one label tensor with the first classifier (logits " +
                        ll.ce_logits.str() + "): every classifier must have as many positions" +
                        std::string(ll.soft ? " and classes" : ""));
    }
  }
  return ll;
}

// The label tensor as the layout has it, checked against the data's labels.
TensorInfo label_tensor(const Graph& g, const ModelSpec& m, const std::map<std::string, TensorId>& outs,
                        const LabelLayout& ll, int64_t nb) {
  TensorInfo lab;
  lab.name = "label";
  lab.role = TensorRole::label;
  if (ll.named) {
    lab.shape = Shape{nb, static_cast<int64_t>(m.label_names.size())};
  } else if (ll.any_ce) {
    std::vector<int64_t> d = ll.ce_logits.dims();
    if (!ll.soft) d.pop_back();  // class indices: one per position
    lab.shape = Shape(d);
  } else {
    lab.shape = g.tensor(outs.at(m.outputs[0].layer)).shape;
  }
  if (!ll.named && (!m.label_shape.dims().empty() || !ll.any_ce)) {
    if (!m.label_shape.dims().empty() && m.label_shape.numel() != lab.shape.numel() / nb)
      throw ConfigError("the data's labels have shape " + m.label_shape.str() + " per example, but output '" +
                        m.outputs[0].layer + "' with its loss needs " + lab.shape.tail().str());
  }
  return lab;
}

// The loss node of output `out`, whose prediction is `y`: it reads the label (or the output's named label column,
// `columns`) and writes the loss and the gradient of the prediction.
void add_loss(Graph& g, const ModelSpec& m, const OutputSpec& out, TensorId y, const LabelLayout& ll,
              const std::vector<TensorId>& columns, int64_t batch, int64_t nb) {
  const Shape& ys = g.tensor(y).shape;
  int64_t rows = batch, cols = ys.numel() / nb;
  OpKind k = out.loss == LossKind::softmax_cross_entropy ? OpKind::SoftmaxCrossEntropy
             : out.loss == LossKind::mse                 ? OpKind::MeanSquaredError
                                                         : OpKind::BinaryCrossEntropy;
  // A sequence classifier averages over every position of every example (PyTorch's F.cross_entropy on
  // logits.view(-1, V)): rows = batch * positions, scale = weight / rows.
  if (k == OpKind::SoftmaxCrossEntropy) {
    cols = ys[ys.rank() - 1];
    rows = ys.numel() / std::max<int64_t>(cols, 1);
  }
  LossAttrs a{rows, cols, out.weight / static_cast<float>(rows), out.from_logits, ll.soft};
  TensorId target = g.label;
  if (ll.named) {
    target = named_target(g, m, out, columns, ys, nb);
  } else if (k != OpKind::SoftmaxCrossEntropy) {
    if (g.tensor(g.label).shape.numel() != ys.numel())
      throw ConfigError("output '" + out.layer + "': " + std::string(op_name(k)) +
                        " needs targets shaped like the output " + ys.tail().str() + ", but the labels are " +
                        g.tensor(g.label).shape.tail().str());
    if (g.tensor(g.label).shape != ys) target = g.add_alias(g.label, ys, out.layer);
  }
  Node n;
  n.kind = k;
  n.attrs = a;
  n.in = {y, target};
  n.layer = out.layer;
  n.device = g.tensor(y).device;
  TensorInfo lt;
  lt.shape = Shape{1};
  lt.role = TensorRole::loss;
  lt.layer = out.layer;
  lt.name = "loss/" + out.layer;
  lt.device = n.device;
  TensorInfo gt;
  gt.shape = ys;
  gt.dtype = g.tensor(y).dtype;  // the prediction's gradient, stored like the prediction
  gt.layer = out.layer;
  gt.device = n.device;
  n.out = {g.add_tensor(lt), g.add_tensor(gt)};
  g.losses.push_back(n.out[0]);
  g.outputs.push_back(y);
  g.output_names.push_back(out.layer);
  g.add_node(std::move(n));
}

}  // namespace

Graph build_graph(const ModelSpec& m, const GraphOptions& o) {
  Graph g;
  g.batch = o.batch;
  add_input(g, m, o.batch);
  const std::map<std::string, TensorId> outs = add_layers(g, m, o);
  if (o.use_ema) read_ema_weights(g);
  const int64_t nb = std::max<int64_t>(o.batch, 1);
  const LabelLayout ll = label_layout(g, m, outs, nb);
  const TensorInfo lab = label_tensor(g, m, outs, ll, nb);
  g.soft_labels = ll.soft;
  g.label = g.add_tensor(lab);
  const std::vector<TensorId> columns = ll.named ? split_named_labels(g, m, nb) : std::vector<TensorId>{};
  for (const auto& out : m.outputs) add_loss(g, m, out, outs.at(out.layer), ll, columns, o.batch, nb);
  if (o.training) {
    append_backward(g);
    if (!o.optimizer) throw Error("build_graph: a training graph needs an optimizer");
    if (m.precision.loss_scaling) append_unscale(g);
    if (o.optimizer->clip_norm > 0) append_clip(g, o.optimizer->clip_norm);
    append_updates(g, *o.optimizer, m);
  }
  apply_memory_savers(g, m.savers, o.training);  // [memory] in_place / recompute / memory_policy
  return g;
}

FrozenSaving frozen_saving(const ModelSpec& m, const Graph& g, const OptimizerSpec& o, size_t alignment) {
  FrozenSaving f;
  std::set<std::string> frozen;
  for (const auto& l : m.layers)
    if (!l.trainable) frozen.insert(l.name);
  if (frozen.empty()) return f;
  std::set<std::string> holding;  // the frozen layers with weights (a frozen add saves nothing)
  // The same model with every layer trainable tells which of the frozen layers' buffers are parameters there (a
  // frozen batch norm's running statistics are buffers either way).
  GraphOptions go;
  go.batch = 1;
  go.training = false;
  go.apply_trainable = false;
  const Graph all = build_graph(m, go);
  for (const auto& t : all.tensors()) {
    if (t.role != TensorRole::parameter || t.alias_of != kNoTensor || !frozen.count(t.layer)) continue;
    // Only what this graph holds (a parameter of a layer placed on another device lives in that device's graph).
    const TensorId here = g.find(t.name);
    if (here == kNoTensor) continue;
    const size_t bytes = aligned_size(t.bytes(), alignment);
    holding.insert(t.layer);
    ++f.tensors;
    f.values += t.shape.numel();
    f.gradient_bytes += bytes;
    f.optimizer_state_bytes += bytes * o.state_tensors_per_param();
    if (o.ema_decay > 0) f.ema_bytes += bytes;
  }
  f.layers = holding.size();
  return f;
}

}  // namespace kiln
