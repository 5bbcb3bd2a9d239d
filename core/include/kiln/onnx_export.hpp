// ONNX mappings: how an op becomes ONNX nodes when `kiln export --format onnx` writes the inference graph. An op's
// mapping lives with its op (a built-in family registers it in core/ops/<family>.cpp, in its KILN_CORE_OPS block),
// so that a new op brings its ONNX form or none; the exporter (apps/kiln) implements OnnxEmitter, calls the mapping
// of each node's kind, and refuses an op without one, naming the layer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/graph.hpp"
#include "kiln/ops.hpp"

namespace kiln {

// onnx.proto's TensorProto.DataType of the tensors Kiln writes (Cast's "to" names one).
inline constexpr int64_t kOnnxFloat = 1, kOnnxInt64 = 7;

// One ONNX node: its op type, input and output names, and attributes in the order they are written.
struct OnnxNode {
  struct Attr {
    enum Type { kFloat = 1, kInt = 2, kInts = 7 } type;  // AttributeProto.AttributeType
    std::string name;
    int64_t i = 0;
    float f = 0.f;
    std::vector<int64_t> ints;
  };
  std::string op;
  std::vector<std::string> in, out;
  std::vector<Attr> attrs;

  OnnxNode& i(const std::string& n, int64_t v) {
    attrs.push_back(Attr{Attr::kInt, n, v, 0.f, {}});
    return *this;
  }
  OnnxNode& f(const std::string& n, float v) {
    attrs.push_back(Attr{Attr::kFloat, n, 0, v, {}});
    return *this;
  }
  OnnxNode& ints(const std::string& n, std::vector<int64_t> v) {
    attrs.push_back(Attr{Attr::kInts, n, 0, 0.f, std::move(v)});
    return *this;
  }
};

// What a mapping writes through: the model being built. The graph is Kiln's inference graph (build_graph with
// training = false), whose tensors' shapes a mapping may read.
class OnnxEmitter {
 public:
  virtual ~OnnxEmitter() = default;

  // The ONNX name of Kiln tensor t: "input", a parameter's own name, else "<layer>/<id>". A view (flatten) becomes a
  // Flatten or Reshape node the first time it is named.
  virtual std::string name(const Graph& g, TensorId t) = 0;
  virtual void add(OnnxNode node) = 0;
  // Initializers named once: a second call with a name already added adds nothing. Each returns the name.
  virtual std::string float_initializer(const std::string& name, const std::vector<int64_t>& dims,
                                        const std::vector<float>& values) = 0;
  virtual std::string int64_initializer(const std::string& name, const std::vector<int64_t>& dims,
                                        const std::vector<int64_t>& values) = 0;
  // The model imports opset 13 unless a mapping needs a later one (LayerNormalization: 17).
  virtual void require_opset(int version) = 0;
  // Throws ConfigError naming n's layer: `what` has no ONNX form here.
  [[noreturn]] virtual void refuse(const Node& n, const std::string& what) = 0;
  // Folding into the node added last (Gemm and Conv take a bias add as their third input): a mapping marks the
  // Kiln tensor that node writes; a later mapping that reads t gets that node back, to change it instead of adding
  // one, when the mark is t, nothing was added since and no other node of the graph reads t; else nullptr.
  virtual void mark_foldable(TensorId t) = 0;
  virtual OnnxNode* fold_target(TensorId t) = 0;

  // The ONNX names of node n's i-th input and output.
  std::string in(const Graph& g, const Node& n, size_t i) { return name(g, n.in[i]); }
  std::string out(const Graph& g, const Node& n, size_t i) { return name(g, n.out[i]); }
  // A float scalar (shape (), named "const/<value>"), broadcast by the node that reads it.
  std::string constant(float v);
  // A 1-D int64 initializer (a shape, for Reshape).
  std::string int64s(const std::string& name, const std::vector<int64_t>& v) {
    return int64_initializer(name, {static_cast<int64_t>(v.size())}, v);
  }
  // `from` reshaped to `dims`, whose first axis is the batch's (written as -1: any batch size); returns `to`.
  std::string reshape(const std::string& from, std::vector<int64_t> dims, const std::string& to);
};

// A mapping adds the ONNX nodes of one Kiln node, or calls refuse for attributes it has no form for. A mapping that
// adds nothing (the losses: not part of inference) makes the exporter skip the op.
using OnnxMapping = std::function<void(OnnxEmitter&, const Graph&, const Node&)>;
// Sets op k's mapping (a later call replaces it). Throws Error for an empty mapping or a kind nothing registered.
void register_onnx_mapping(OpKind k, OnnxMapping m);
// The mapping of op k; nullptr when it has none (the exporter then refuses the op).
const OnnxMapping* find_onnx_mapping(OpKind k);

}  // namespace kiln
