// The op table: every op, built-in or registered by a plugin, described once. Everything the core needs to know
// about an op (its buffers, aliasing, loss role, per-step scalars, gradient rule, reference implementation and
// cache key) is a lookup here; nothing in the core switches over op kinds. Semantics of the built-in ops are
// written in ops.hpp; a plugin's op documents its own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/graph.hpp"
#include "kiln/op_case.hpp"
#include "kiln/ops.hpp"

namespace kiln {

struct StepScalars;
struct OpCall;

// What a gradient rule sees: the forward node, the gradients of its outputs, and ways to emit backward ops.
// Rules emit ordinary ops; a rule may use any registered op (a plugin's rule may emit its own backward op).
class GradContext {
 public:
  virtual ~GradContext() = default;
  virtual const Node& node() const = 0;
  // Gradient of output `i` of the node, shaped like it; kNoTensor when that output does not affect the loss.
  virtual TensorId dy(size_t i = 0) const = 0;
  virtual bool needs_grad(TensorId x) const = 0;  // whether x (an input of the node) needs a gradient
  virtual Shape shape(TensorId t) const = 0;
  // A backward intermediate of the node's layer and device, stored in the node's compute type.
  virtual TensorId new_tensor(const Shape& s) = 0;
  virtual TensorId new_tensor(const Shape& s, DType t) = 0;
  // The type t's gradient is stored in: t's own, except float32 for a 16-bit copy of a float32 parameter.
  virtual DType dtype(TensorId t) const = 0;
  // A tensor to hold the gradient of x: shaped and typed like x.
  TensorId grad_tensor(TensorId x) { return new_tensor(shape(x), dtype(x)); }
  virtual void emit(OpKind k, OpAttrs a, std::vector<TensorId> in, std::vector<TensorId> out) = 0;
  virtual void contribute(TensorId x, TensorId d) = 0;  // d is (a part of) the gradient of x
  // The common case: emits op k writing a new tensor shaped like x and contributes it to x's gradient.
  TensorId emit_grad(TensorId x, OpKind k, OpAttrs a, std::vector<TensorId> in) {
    TensorId d = grad_tensor(x);
    emit(k, std::move(a), std::move(in), {d});
    contribute(x, d);
    return d;
  }
};

// Per-step scalars an op reads (the executor patches them into the bound call before every step).
enum StepScalar : uint8_t {
  kStepNone = 0,
  kStepLearningRate = 1,
  kStepCount = 2,
  kStepDropoutCounter = 4,
  kStepLossScale = 8
};

struct OpDesc {
  std::string name;        // stable, lower-case: reports, repro lines, tolerance files
  size_t attrs_index = 0;  // the OpAttrs alternative this op takes (variant index)
  // Element count of every input and output; throws Error naming the op for attributes out of range.
  std::function<OpArity(const OpAttrs&)> arity;
  // (output, input): that output may be exactly that input's buffer (the op then runs in place).
  std::vector<std::pair<int, int>> may_alias;
  // The output this op ignores with these attributes (it may then be bound to any buffer), or -1.
  std::function<int(const OpAttrs&)> unused_output;
  // A fused loss: in[0] is the prediction, out[0] the scalar loss, out[1] the gradient w.r.t. in[0].
  bool is_loss = false;
  // Inputs that carry data and are never differentiated (class labels, token ids).
  std::vector<int> data_inputs;
  // Outputs kept for the backward op that no gradient flows through (layer norm's mean and rstd): gradient
  // checks give them weight 0, and the gradient rule ignores their dy.
  std::vector<int> saved_outputs;
  // Mixed precision. low_precision: the inputs a 16-bit layer casts to its compute type before this op (matrix
  // products and convolutions: PyTorch's autocast lower-precision list); their kernels read 16-bit storage
  // natively. f32_outputs: outputs kept in float32 whatever the layer's type (saved_outputs and a loss's value are
  // always float32; a loss's gradient takes its prediction's type).
  std::vector<int> low_precision;
  std::vector<int> f32_outputs;
  uint8_t step_scalars = kStepNone;
  // Writes the step scalars into the attributes. It is given the node's attributes as the graph holds them every
  // time (the executor copies them before patching), so it may scale a field rather than overwrite it.
  std::function<void(OpAttrs&, const StepScalars&)> patch;
  std::function<void(GradContext&)> grad;  // empty: not differentiable
  // The oracle: naive loops on host buffers sized as arity() says.
  std::function<void(const OpAttrs&, std::span<const float* const>, std::span<float* const>)> reference;
  // Appends the attributes that define the call's work to a record/replay cache key (step scalars excluded).
  std::function<void(const OpAttrs&, std::string&)> key;
  // Conformance cases (run on every backend against the reference; those marked gradcheck also check the
  // gradient rule by finite differences). A built-in op's are in its family's file, core/ops/<family>.cpp.
  std::function<std::vector<OpCase>()> cases;
  std::string plugin = "core";  // who registered it
};

inline constexpr size_t kBuiltinOpCount = static_cast<size_t>(OpKind::Count_);

// The descriptor of `k`; throws Error for a kind nothing registered.
const OpDesc& op_desc(OpKind k);
bool op_known(OpKind k);
size_t op_count();  // built-in ops plus registered ones
std::optional<OpKind> find_op(std::string_view name);
// Adds a plugin's op to the process-wide table and returns its kind (>= OpKind::Count_). Registering an equal
// name again from the same plugin returns the existing kind (a plugin loaded twice); from another plugin, or
// with a built-in op's name, it throws Error. Throws Error for a descriptor without name, arity or reference.
OpKind register_op(OpDesc d);
// The descriptor of a built-in kind (< OpKind::Count_), from the file of its op family (core/ops/<family>.cpp).
// Throws Error for a kind registered twice or a descriptor without name, arity or reference.
void register_op(OpKind builtin_kind, OpDesc d);
// Throws Error naming every built-in kind that has no descriptor (its core/ops file did not register it).
void check_builtin_ops();

// Each op family of the core lives in one file, core/ops/<family>.cpp, that registers its ops (register_op),
// kernel-independent parts included (arity, aliasing, gradient rule, reference, conformance cases), and any layer
// of its own (add_core_layer), when libkiln_core loads:
//   KILN_CORE_OPS(layer_norm) { register_op(OpKind::LayerNormForward, ...); add_core_layer("layer_norm", ...); }
#define KILN_CORE_OPS(family)                                                                                \
  static void kiln_core_ops_##family();                                                                      \
  [[maybe_unused]] static const bool kiln_core_ops_##family##_registered = (kiln_core_ops_##family(), true); \
  static void kiln_core_ops_##family()

// Checks a call against its op's contract: attribute type, buffer counts, every buffer bound and large enough
// inside its block, 4-byte aligned, and no overlap except what may_alias and unused_output allow. Throws
// DeviceError starting with `where` and the op's name. The executor runs it once per call when it binds, so
// devices run calls without checking them again.
void check_call(const OpCall& call, const std::string& where);

// The attributes of a call as a record/replay cache key (op kind included).
void append_op_key(OpKind k, const OpAttrs& a, std::string& key);

}  // namespace kiln
