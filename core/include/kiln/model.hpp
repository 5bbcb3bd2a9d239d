// A model as configured: layers (sequential or a DAG), outputs with losses, optimizer, and graph building.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/graph.hpp"
#include "kiln/layer.hpp"
#include "kiln/memory_savers.hpp"

namespace kiln {

class ConfigNode;
class Registry;

struct LayerSpec {
  std::string name, type;
  std::vector<std::string> inputs;  // layer names or "input"
  std::string device;               // model-parallel placement ("" = strategy decides)
  std::unique_ptr<Layer> layer;
  // The [[model.layers]] table it was read from, so errors found while the graph builds name its file, line and key;
  // null for a layer made in code.
  std::shared_ptr<const ConfigNode> config;
  // `precision = "float32"` on a layer: its ops compute and store in that type whatever [precision] compute says.
  std::optional<DType> precision;
  // `trainable = false` (Keras' layer.trainable, PyTorch's requires_grad_(False)): its parameters become buffers
  // (no gradient, no optimizer state, never updated, still checkpointed) and a batch norm in it normalizes with its
  // running statistics.
  bool trainable = true;
  // `learning_rate_scale`: the optimizer's rate for this layer's parameters is the schedule's times this.
  float lr_scale = 1.f;
  // A layer of a repeated block: where the block is and which repetition ("repetition i = 2 of the block repeated at
  // run.toml:31 (model.layers[2])"), added to its errors; "" otherwise.
  std::string block;
};

enum class LossKind : uint8_t { softmax_cross_entropy, mse, binary_cross_entropy };
struct OutputSpec {
  std::string layer;  // which layer's output
  LossKind loss = LossKind::softmax_cross_entropy;
  float weight = 1.f;
  bool from_logits = true;  // binary cross-entropy
  std::string label;        // one of the data's named labels (ModelSpec::label_names); "" = the data's one label
};

enum class OptimizerKind : uint8_t { sgd, adam, rmsprop, adamw };
enum class ScheduleKind : uint8_t { constant, exponential, step, cosine };
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::constant;
  double decay_rate = 0.96;  // exponential: lr * rate^(step/decay_steps); step: lr * rate^floor(step/decay_steps)
  int64_t decay_steps = 1000;
  bool staircase = false;
  int64_t total_steps = 0;   // cosine: steps after the warmup to reach the floor (0 = the rest of the run)
  double alpha = 0.0;        // cosine floor as a fraction of lr
  double min_lr = -1;        // cosine floor in absolute terms (nanoGPT's min_lr); < 0: alpha * lr
  int64_t warmup_steps = 0;  // linear warmup before the schedule: lr * (step + 1) / (warmup_steps + 1)
};
// Which parameters weight decay applies to: all, or only those of rank >= 2 (matmul and conv kernels, embedding
// tables; never biases or normalization scales), nanoGPT's rule.
enum class DecayParams : uint8_t { all, matrices };
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::adam;
  double lr = 1e-3, momentum = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-7, rho = 0.9, weight_decay = 0;
  bool nesterov = false;
  DecayParams decay_params = DecayParams::all;
  ScheduleSpec schedule;
  double ema_decay = 0;     // 0 = no EMA
  bool ema_warmup = false;  // decay = min(ema_decay, (1 + step) / (10 + step)), TensorFlow's num_updates form
  // Gradient clipping by global L2 norm over every parameter (PyTorch's clip_grad_norm_, Keras' global_clipnorm),
  // computed on the device before the update; 0 = off.
  double clip_norm = 0;
  double learning_rate_at(int64_t step) const;  // step is 0-based
  size_t state_tensors_per_param() const;       // adam(w) 2, rmsprop 1 or 2, sgd 0 or 1
};

// [precision]: the compute type of every layer (Keras's mixed-precision policy: parameters and optimizer state stay
// float32, activations are stored in `compute`, products read it and accumulate in float32) and float16's dynamic
// loss scaling, GradScaler's semantics and defaults.
struct PrecisionSpec {
  DType compute = DType::f32;
  bool loss_scaling = false;  // float16 only: on by default there
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct ModelSpec {
  Shape input_shape;  // per example
  Shape label_shape;  // per example; () for class indices
  // The data's named labels, one value each, in the order of the label tensor (the train source's label_names()).
  // When outputs name their label, the label tensor (N, names) is split into one (N) column per output.
  std::vector<std::string> label_names;
  std::vector<LayerSpec> layers;
  std::vector<OutputSpec> outputs;
  uint32_t seed = 0;
  MemorySavers savers;  // [memory]: applied by build_graph (apply_memory_savers)
  PrecisionSpec precision;
  // The 16-bit types some layer computes in ([precision] compute and layers' precision keys).
  std::vector<DType> compute_types() const;
};

// Reads [model] (layers, outputs/loss) using the layer factories in `reg`. Throws ConfigError.
ModelSpec parse_model(const ConfigNode& model, const Registry& reg);
OptimizerSpec parse_optimizer(const ConfigNode& opt);
// "float32" | "bfloat16" | "float16" at `key`; ConfigError naming file, line and key otherwise.
DType parse_dtype(const ConfigNode& c, const std::string& key);
// Reads [precision] (compute, loss_scale, init_scale, growth_factor, backoff_factor, growth_interval).
PrecisionSpec parse_precision(const ConfigNode& p);

struct GraphOptions {
  int64_t batch = 32;
  bool training = true;                      // false: forward + losses only, dropout off
  bool use_ema = false;                      // eval: read the EMA shadow instead of the parameters
  const OptimizerSpec* optimizer = nullptr;  // training: append update nodes
  // Model-parallel placement: the device index (into the strategy's list) of each layer; null = all on 0.
  std::function<int(const LayerSpec&)> place;
  // false: every layer trains whatever its trainable key says (frozen_saving compares against that model).
  bool apply_trainable = true;
};
// Forward (+ backward + update when training). Persistent tensors are named so several graphs share them.
Graph build_graph(const ModelSpec& m, const GraphOptions& o);

// What `trainable = false` saves in a training step: the frozen layers that hold weights, those weights (buffers in the
// graph), and
// the bytes of what they would otherwise have had: a gradient, the optimizer's state tensors and an EMA shadow each,
// every tensor rounded up to `alignment` as the planner rounds it.
struct FrozenSaving {
  size_t layers = 0, tensors = 0;
  int64_t values = 0;
  size_t gradient_bytes = 0, optimizer_state_bytes = 0, ema_bytes = 0;
  size_t bytes() const { return gradient_bytes + optimizer_state_bytes + ema_bytes; }
};
FrozenSaving frozen_saving(const ModelSpec& m, const Graph& g, const OptimizerSpec& o, size_t alignment);

}  // namespace kiln
