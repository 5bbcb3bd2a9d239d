// The static training graph: tensors and op nodes, built by layers, differentiated by per-op rules.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "kiln/allocator.hpp"
#include "kiln/ops.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

using TensorId = int32_t;
inline constexpr TensorId kNoTensor = -1;

enum class TensorRole : uint8_t {
  input,            // a batch of features, copied in each step
  label,            // a batch of labels
  parameter,        // trainable weights (persistent)
  gradient,         // gradient of a parameter (lives through the step)
  optimizer_state,  // persistent
  ema,              // exponential moving average of a parameter (persistent)
  activation,       // forward outputs and backward intermediates (planned in the arena)
  loss,             // a scalar loss (planned, read back each step)
  buffer,           // persistent state that is not trained (batch norm's running statistics): checkpointed, never
                    // given to the optimizer; under data_parallel each replica keeps its own (replica 0's is saved)
};
MemoryTag role_tag(TensorRole r);
bool role_persistent(TensorRole r);

enum class InitKind : uint8_t { zeros, ones, glorot_uniform, he_normal, constant, normal };  // normal: N(0, value^2)
struct Init {
  InitKind kind = InitKind::zeros;
  int64_t fan_in = 0, fan_out = 0;
  float value = 0.f;
};

struct TensorInfo {
  Shape shape;
  TensorRole role = TensorRole::activation;
  std::string name;               // persistent tensors: unique key ("dense_1.kernel", "dense_1.kernel/adam_m")
  std::string layer;              // the layer that produced it
  TensorId alias_of = kNoTensor;  // a reshape view shares its root's storage
  Init init;
  int device = 0;  // index into the strategy's device list
  // Storage type: persistent tensors, inputs, labels, losses and statistics are float32; activations and their
  // gradients take their layer's compute type (GraphBuilder::set_compute).
  DType dtype = DType::f32;
  size_t bytes() const { return storage_bytes(shape.numel(), dtype); }
};

// unscale: float16's loss scaling divides the gradients by the scale and sums their squares (Graph::grad_sq), which
// the runner reads to skip the update of a step whose gradients are not finite.
enum class Phase : uint8_t { forward, backward, unscale, update };

struct Node {
  OpKind kind{};
  OpAttrs attrs;
  std::vector<TensorId> in, out;
  std::string layer;  // for errors and reports
  Phase phase = Phase::forward;
  int device = 0;
  DType compute = DType::f32;  // the layer's compute type: backward intermediates of this node take it
};

class Graph {
 public:
  TensorId add_tensor(TensorInfo t);
  // A view of `of` with another shape of the same element count (no copy).
  TensorId add_alias(TensorId of, Shape shape, std::string layer);
  void add_node(Node n);

  const TensorInfo& tensor(TensorId id) const { return tensors_.at(static_cast<size_t>(id)); }
  TensorInfo& tensor(TensorId id) { return tensors_.at(static_cast<size_t>(id)); }
  TensorId root(TensorId id) const;  // follows alias_of
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  TensorId find(const std::string& persistent_name) const;  // kNoTensor if absent

  // Named roles of the step.
  TensorId input = kNoTensor;
  TensorId label = kNoTensor;
  std::vector<TensorId> losses;   // one per model output
  std::vector<TensorId> outputs;  // model outputs (logits/predictions), per head
  std::vector<std::string> output_names;
  std::vector<std::pair<TensorId, TensorId>> param_grads;  // (parameter, gradient)
  // clip_norm: the sum of squares of every gradient, (1), written in the update phase and alive to the step's end
  // (runners read it back as the gradient norm); kNoTensor without clipping.
  TensorId grad_sq = kNoTensor;
  // float16 with dynamic loss scaling: losses are scaled, Phase::unscale nodes unscale the gradients and fill
  // grad_sq; a non-finite grad_sq means the step is skipped (no update nodes run).
  bool loss_scaling = false;
  // softmax_cross_entropy heads take class probabilities (one value per class) rather than class indices.
  bool soft_labels = false;
  int64_t batch = 0;
  // The planner may run ops whose contract says "may alias" in place (MemorySavers::inplace).
  bool inplace = false;
  // Per layer, in model order: name, type, output tensor (for plan tables and NaN tracing).
  struct LayerOut {
    std::string name, type;
    TensorId out;
  };
  std::vector<LayerOut> layer_outputs;

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<Node> nodes_;
};

// What layers use to emit their forward ops.
class GraphBuilder {
 public:
  GraphBuilder(Graph& g, int64_t batch, bool training, uint32_t seed)
      : g_(g), batch_(batch), training_(training), seed_(seed) {}

  // Sets the layer subsequent calls belong to.
  void begin_layer(const std::string& name, int device) {
    layer_ = name;
    device_ = device;
  }
  // The storage type of the activations the ops of the current layer write (float32 unless a 16-bit precision
  // policy says otherwise). In a 16-bit layer, the float32 inputs an op reads as products (OpDesc::low_precision)
  // are cast once per graph; outputs the op keeps in float32 (OpDesc::f32_outputs, saved statistics, a loss) stay so.
  void set_compute(DType t) { compute_ = t; }
  DType compute() const { return compute_; }
  // x in type t: x itself, or the output of a Cast node (one per tensor, type and device per graph).
  TensorId cast(TensorId x, DType t);
  const std::string& layer() const { return layer_; }
  // A trainable parameter named "<layer>.<name>".
  TensorId param(const std::string& name, Shape shape, Init init);
  // A persistent non-trainable tensor named "<layer>.<name>" (TensorRole::buffer), e.g. running statistics.
  TensorId buffer(const std::string& name, Shape shape, Init init);
  // A parameter another layer created (weight tying): its full name ("wte.table"); ConfigError naming `key` when no
  // layer built before this one holds it or it lives on another device.
  TensorId shared_param(const std::string& full_name, const std::string& key) const;
  // Emits an op; returns its outputs (activations with the given shapes, batch dim included).
  std::vector<TensorId> op(OpKind kind, OpAttrs attrs, std::vector<TensorId> in, std::vector<Shape> out_shapes);
  TensorId op1(OpKind kind, OpAttrs attrs, std::vector<TensorId> in, Shape out_shape) {
    return op(kind, std::move(attrs), std::move(in), {std::move(out_shape)})[0];
  }
  TensorId reshape(TensorId x, Shape s) { return g_.add_alias(x, std::move(s), layer_); }
  // By value: the graph's tensor list grows as ops are added, so a reference would dangle.
  Shape shape(TensorId t) const { return g_.tensor(t).shape; }
  int64_t batch() const { return batch_; }
  bool training() const { return training_; }
  // A seed unique to the current layer (dropout masks), derived from the run seed.
  uint32_t layer_seed() const;
  Graph& graph() { return g_; }

 private:
  Graph& g_;
  int64_t batch_;
  bool training_;
  uint32_t seed_;
  std::string layer_;
  int device_ = 0;
  DType compute_ = DType::f32;
  std::map<std::tuple<TensorId, DType, int>, TensorId> casts_;
  std::unordered_set<std::string> param_names_;  // duplicate check in O(1) (a scan of the graph was quadratic)
};

// Appends backward nodes for `g` (per-op gradient rules) starting from the fused losses, and fills
// g.param_grads. Throws Error naming an op with no rule.
void append_backward(Graph& g);

}  // namespace kiln
