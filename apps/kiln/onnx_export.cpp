// kiln export --format onnx: the forward graph Kiln evaluates with (build_graph, training = false), node by node, as
// an ONNX model (IR 7, opset 13) written with a small protobuf wire-format encoder (the few fields of onnx.proto
// used here, by field number). The batch dimension is symbolic ("N"); the weights are initializers under Kiln's names.
// Each node becomes ONNX nodes through its op's mapping (kiln/onnx_export.hpp, registered in core/ops/<family>.cpp);
// OnnxWriter is the OnnxEmitter they write through.
#include "kiln/onnx_export.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "kiln/error.hpp"
#include "kiln/graph.hpp"
#include "model_io.hpp"

namespace kiln::app {

namespace {

// Protobuf wire format: a field is a varint key (number << 3 | wire type) and its value.
struct Pb {
  std::string b;
  void varint(uint64_t v) {
    while (v >= 0x80) {
      b += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    b += static_cast<char>(v);
  }
  Pb& i64(int field, int64_t v) {  // int64 / int32 / enum (negative values as 10-byte varints, as protobuf does)
    varint(static_cast<uint64_t>(field) << 3);
    varint(static_cast<uint64_t>(v));
    return *this;
  }
  Pb& f32(int field, float v) {
    varint(static_cast<uint64_t>(field) << 3 | 5);
    char c[4];
    std::memcpy(c, &v, 4);
    b.append(c, 4);
    return *this;
  }
  Pb& bytes(int field, const std::string& v) {
    varint(static_cast<uint64_t>(field) << 3 | 2);
    varint(v.size());
    b += v;
    return *this;
  }
  Pb& msg(int field, const Pb& m) { return bytes(field, m.b); }
};

// onnx.proto: TensorProto.DataType FLOAT = 1, INT64 = 7; AttributeProto.AttributeType FLOAT 1, INT 2, INTS 7.
constexpr int kFloat = static_cast<int>(kOnnxFloat), kInt64 = static_cast<int>(kOnnxInt64);

Pb tensor(const std::string& name, const std::vector<int64_t>& dims, int type, const void* data, size_t bytes) {
  Pb t;
  for (auto d : dims) t.i64(1, d);                                 // dims
  t.i64(2, type);                                                  // data_type
  t.bytes(8, name);                                                // name
  t.bytes(9, std::string(static_cast<const char*>(data), bytes));  // raw_data (little-endian)
  return t;
}

Pb value_info(const std::string& name, const std::vector<int64_t>& tail) {
  Pb shape;
  shape.msg(1, Pb().bytes(2, "N"));  // dim { dim_param: "N" }
  for (auto d : tail) shape.msg(1, Pb().i64(1, d));
  Pb tt;
  tt.i64(1, kFloat).msg(2, shape);  // TypeProto.Tensor { elem_type, shape }
  Pb type;
  type.msg(1, tt);  // TypeProto { tensor_type }
  Pb v;
  v.bytes(1, name).msg(2, type);
  return v;
}

// A node as NodeProto: inputs, outputs, name, op type, then its attributes (field 5 each) in order.
Pb node_proto(const OnnxNode& x, size_t index) {
  Pb n;
  for (const auto& s : x.in) n.bytes(1, s);
  for (const auto& s : x.out) n.bytes(2, s);
  n.bytes(3, x.op + "_" + std::to_string(index));
  n.bytes(4, x.op);
  for (const auto& a : x.attrs) {
    Pb p;
    p.bytes(1, a.name);
    if (a.type == OnnxNode::Attr::kInts)
      for (auto v : a.ints) p.i64(8, v);
    else if (a.type == OnnxNode::Attr::kInt)
      p.i64(3, a.i);
    else
      p.f32(2, a.f);
    p.i64(20, a.type);
    n.msg(5, p);
  }
  return n;
}

class OnnxWriter final : public OnnxEmitter {
 public:
  OnnxWriter(const TrainedModel& m) : m_(m) {}

  std::string write() {
    const ModelSpec& model = m_.session->model();
    GraphOptions go;
    go.batch = 1;
    go.training = false;
    Graph g = build_graph(model, go);
    for (const auto& n : g.nodes())
      for (TensorId t : n.in) ++uses_[t];
    for (const auto& [name, shape] : m_.params) {
      const HostTensor& w = m_.weights.at(name);
      init_.push_back(tensor(name, shape.dims(), kFloat, w.data.data(), w.bytes()));
    }
    for (size_t i = 0; i < g.nodes().size(); ++i) emit(g, g.nodes()[i]);
    // Heads: what `kiln predict` writes (softmax / sigmoid probabilities, raw outputs).
    std::vector<Pb> outputs;
    for (size_t h = 0; h < model.outputs.size(); ++h) {
      const OutputSpec& head = model.outputs[h];
      const TensorId y = g.outputs[h];
      std::string op = head.loss == LossKind::softmax_cross_entropy                      ? "Softmax"
                       : head.loss == LossKind::binary_cross_entropy && head.from_logits ? "Sigmoid"
                                                                                         : "Identity";
      OnnxNode n{op, {name(g, y)}, {head.layer}, {}};
      if (op == "Softmax") n.i("axis", -1);
      nodes_.push_back(std::move(n));
      outputs.push_back(value_info(head.layer, g.tensor(y).shape.tail().dims()));
    }
    Pb graph;
    for (size_t i = 0; i < nodes_.size(); ++i) graph.msg(1, node_proto(nodes_[i], i));
    graph.bytes(2, m_.session->run_name().empty() ? "kiln" : m_.session->run_name());
    for (const auto& t : init_) graph.msg(5, t);
    graph.msg(11, value_info("input", model.input_shape.dims()));
    for (const auto& o : outputs) graph.msg(12, o);
    Pb model_proto;
    model_proto.i64(1, 7);  // ir_version
    model_proto.bytes(2, "kiln").bytes(3, KILN_VERSION_STRING);
    model_proto.msg(7, graph);
    model_proto.msg(
        8, Pb().bytes(1, "").i64(2, opset_));  // opset_import { domain "", version 13, or 17 with LayerNormalization }
    return model_proto.b;
  }

  // The ONNX name of a Kiln tensor: parameters keep their names; a view (flatten) becomes a Flatten/Reshape node.
  std::string name(const Graph& g, TensorId t) override {
    auto it = names_.find(t);
    if (it != names_.end()) return it->second;
    const TensorInfo& ti = g.tensor(t);
    std::string n;
    if (t == g.input)
      n = "input";
    else if (ti.role == TensorRole::parameter || ti.role == TensorRole::buffer)
      n = ti.name;
    else
      n = ti.layer + "/" + std::to_string(t);
    if (ti.alias_of != kNoTensor) {
      const std::string from = name(g, ti.alias_of);
      const Shape& s = ti.shape;
      if (s.rank() == 2 && g.tensor(ti.alias_of).shape.rank() > 2) {
        nodes_.push_back(OnnxNode{"Flatten", {from}, {n}, {}}.i("axis", 1));
      } else {
        std::vector<int64_t> dims = s.dims();
        dims[0] = -1;  // the batch
        const std::string shape_name = n + "/shape";
        init_.push_back(tensor(shape_name, {static_cast<int64_t>(dims.size())}, kInt64, dims.data(), dims.size() * 8));
        nodes_.push_back(OnnxNode{"Reshape", {from, shape_name}, {n}, {}});
      }
    }
    names_[t] = n;
    return n;
  }

  void add(OnnxNode node) override { nodes_.push_back(std::move(node)); }

  std::string float_initializer(const std::string& n, const std::vector<int64_t>& dims,
                                const std::vector<float>& v) override {
    if (consts_.insert(n).second) init_.push_back(tensor(n, dims, kFloat, v.data(), v.size() * sizeof(float)));
    return n;
  }
  std::string int64_initializer(const std::string& n, const std::vector<int64_t>& dims,
                                const std::vector<int64_t>& v) override {
    if (consts_.insert(n).second) init_.push_back(tensor(n, dims, kInt64, v.data(), v.size() * sizeof(int64_t)));
    return n;
  }

  void require_opset(int version) override { opset_ = std::max(opset_, version); }

  [[noreturn]] void refuse(const ::kiln::Node& n, const std::string& what) override {
    throw ConfigError(
        "--format onnx: layer '" + n.layer + "': " + what +
        " has no ONNX opset 13 form in this exporter (supported: dense, conv2d, max/avg pooling, flatten, "
        "relu/sigmoid/tanh/silu/gelu/softmax activations, dropout, add, concat, embedding, positional_embedding, "
        "layer_norm, batch_norm (evaluation), global_avg_pool2d, attention); export the weights "
        "with --format safetensors instead");
  }

  void mark_foldable(TensorId t) override {
    foldable_ = t;
    foldable_node_ = nodes_.size() - 1;
  }
  OnnxNode* fold_target(TensorId t) override {
    if (t != foldable_ || nodes_.empty() || foldable_node_ != nodes_.size() - 1 || uses_[t] != 1) return nullptr;
    return &nodes_.back();
  }

 private:
  // Node n as ONNX nodes, by the mapping its op registered (core/ops/<family>.cpp).
  void emit(const Graph& g, const ::kiln::Node& n) {
    const OnnxMapping* m = find_onnx_mapping(n.kind);
    if (m == nullptr) refuse(n, "op " + std::string(op_name(n.kind)));
    (*m)(*this, g, n);
  }

  const TrainedModel& m_;
  std::map<TensorId, std::string> names_;
  std::map<TensorId, int> uses_;
  std::vector<OnnxNode> nodes_;
  std::vector<Pb> init_;
  TensorId foldable_ = kNoTensor;  // mark_foldable's tensor, written by nodes_[foldable_node_]
  size_t foldable_node_ = 0;
  std::set<std::string> consts_;
  int opset_ = 13;
};

}  // namespace

std::string onnx_model(const TrainedModel& m) { return OnnxWriter(m).write(); }

}  // namespace kiln::app
