// kiln export --format onnx: the forward graph Kiln evaluates with (build_graph, training = false), node by node, as
// an ONNX model (IR 7, opset 13) written with a small protobuf wire-format encoder (the few fields of onnx.proto
// used here, by field number). The batch dimension is symbolic ("N"); the weights are initializers under Kiln's names.
#include <cmath>
#include <cstring>
#include <map>

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
constexpr int kFloat = 1, kInt64 = 7;

Pb tensor(const std::string& name, const std::vector<int64_t>& dims, int type, const void* data, size_t bytes) {
  Pb t;
  for (auto d : dims) t.i64(1, d);  // dims
  t.i64(2, type);                   // data_type
  t.bytes(8, name);                 // name
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

struct Node {
  std::string op;
  std::vector<std::string> in, out;
  Pb attrs;  // AttributeProto messages, field 5 of NodeProto each
  Node& ints(const std::string& n, const std::vector<int64_t>& v) {
    Pb a;
    a.bytes(1, n);
    for (auto x : v) a.i64(8, x);
    a.i64(20, 7);
    attrs.msg(5, a);
    return *this;
  }
  Node& i(const std::string& n, int64_t v) {
    attrs.msg(5, Pb().bytes(1, n).i64(3, v).i64(20, 2));
    return *this;
  }
  Node& f(const std::string& n, float v) {
    attrs.msg(5, Pb().bytes(1, n).f32(2, v).i64(20, 1));
    return *this;
  }
};

class OnnxWriter {
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
      Node n{op, {name(g, y)}, {head.layer}, {}};
      if (op == "Softmax") n.i("axis", -1);
      nodes_.push_back(std::move(n));
      outputs.push_back(value_info(head.layer, g.tensor(y).shape.tail().dims()));
    }
    Pb graph;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      Pb n;
      for (const auto& s : nodes_[i].in) n.bytes(1, s);
      for (const auto& s : nodes_[i].out) n.bytes(2, s);
      n.bytes(3, nodes_[i].op + "_" + std::to_string(i));
      n.bytes(4, nodes_[i].op);
      n.b += nodes_[i].attrs.b;
      graph.msg(1, n);
    }
    graph.bytes(2, m_.session->run_name().empty() ? "kiln" : m_.session->run_name());
    for (const auto& t : init_) graph.msg(5, t);
    graph.msg(11, value_info("input", model.input_shape.dims()));
    for (const auto& o : outputs) graph.msg(12, o);
    Pb model_proto;
    model_proto.i64(1, 7);  // ir_version
    model_proto.bytes(2, "kiln").bytes(3, KILN_VERSION_STRING);
    model_proto.msg(7, graph);
    model_proto.msg(8, Pb().bytes(1, "").i64(2, 13));  // opset_import { domain "", version 13 }
    return model_proto.b;
  }

 private:
  // The ONNX name of a Kiln tensor: parameters keep their names; a view (flatten) becomes a Flatten/Reshape node.
  std::string name(const Graph& g, TensorId t) {
    auto it = names_.find(t);
    if (it != names_.end()) return it->second;
    const TensorInfo& ti = g.tensor(t);
    std::string n;
    if (t == g.input) n = "input";
    else if (ti.role == TensorRole::parameter) n = ti.name;
    else n = ti.layer + "/" + std::to_string(t);
    if (ti.alias_of != kNoTensor) {
      const std::string from = name(g, ti.alias_of);
      const Shape& s = ti.shape;
      if (s.rank() == 2 && g.tensor(ti.alias_of).shape.rank() > 2) {
        nodes_.push_back(Node{"Flatten", {from}, {n}, {}}.i("axis", 1));
      } else {
        std::vector<int64_t> dims = s.dims();
        dims[0] = -1;  // the batch
        const std::string shape_name = n + "/shape";
        init_.push_back(tensor(shape_name, {static_cast<int64_t>(dims.size())}, kInt64, dims.data(), dims.size() * 8));
        nodes_.push_back(Node{"Reshape", {from, shape_name}, {n}, {}});
      }
    }
    names_[t] = n;
    return n;
  }

  [[noreturn]] void refuse(const ::kiln::Node& n, const std::string& what) {
    throw ConfigError("--format onnx: layer '" + n.layer + "': " + what +
                      " has no ONNX opset 13 form in this exporter (supported: dense, conv2d, max/avg pooling, flatten, "
                      "relu/sigmoid/tanh/silu/softmax activations, dropout, add, concat, embedding); export the weights "
                      "with --format safetensors instead");
  }

  void emit(const Graph& g, const ::kiln::Node& n) {
    auto in = [&](size_t i) { return name(g, n.in[i]); };
    auto out = [&](size_t i) { return name(g, n.out[i]); };
    switch (n.kind) {
      case OpKind::SoftmaxCrossEntropy:
      case OpKind::MeanSquaredError:
      case OpKind::BinaryCrossEntropy:
        return;  // losses: not part of inference
      case OpKind::Gemm: {
        const auto& a = std::get<GemmAttrs>(n.attrs);
        if (a.trans_a || a.beta != 0.f || a.alpha != 1.f) refuse(n, "a transposed or scaled gemm");
        if (g.tensor(n.in[0]).shape.rank() == 2) {
          Node x{"Gemm", {in(0), in(1)}, {out(0)}, {}};
          if (a.trans_b) x.i("transB", 1);
          last_fusable_ = n.out[0];
          nodes_.push_back(std::move(x));
        } else {  // (N, T, F) x (F, U): MatMul broadcasts over the leading dims
          std::string w = in(1);
          if (a.trans_b) {
            nodes_.push_back(Node{"Transpose", {w}, {w + "/T"}, {}}.ints("perm", {1, 0}));
            w += "/T";
          }
          nodes_.push_back(Node{"MatMul", {in(0), w}, {out(0)}, {}});
        }
        return;
      }
      case OpKind::Conv2dForward: {
        const auto& a = std::get<ConvAttrs>(n.attrs);
        const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.r - a.h - a.pad_h);
        const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.s - a.w - a.pad_w);
        nodes_.push_back(Node{"Conv", {in(0), in(1)}, {out(0)}, {}}
                             .ints("kernel_shape", {a.r, a.s})
                             .ints("strides", {a.stride_h, a.stride_w})
                             .ints("pads", {a.pad_h, a.pad_w, pb, pr}));
        last_fusable_ = n.out[0];
        return;
      }
      case OpKind::BiasAdd: {
        const auto& a = std::get<BiasAttrs>(n.attrs);
        // Gemm and Conv take the bias as their third input when nothing else reads their output.
        if (n.in[0] == last_fusable_ && uses_[n.in[0]] == 1 && !nodes_.empty() && nodes_.back().in.size() == 2 &&
            (nodes_.back().op == "Gemm" || nodes_.back().op == "Conv") && g.tensor(n.in[1]).shape.rank() == 1) {
          nodes_.back().in.push_back(in(1));
          nodes_.back().out[0] = out(0);
          return;
        }
        std::string b = in(1);
        if (a.inner > 1) {  // (C) -> (C, 1, ..., 1) to broadcast over the trailing dims
          std::vector<int64_t> dims{a.channels};
          dims.resize(g.tensor(n.in[0]).shape.rank() - 1, 1);
          init_.push_back(tensor(b + "/bshape", {static_cast<int64_t>(dims.size())}, kInt64, dims.data(), dims.size() * 8));
          nodes_.push_back(Node{"Reshape", {b, b + "/bshape"}, {b + "/b"}, {}});
          b += "/b";
        }
        nodes_.push_back(Node{"Add", {in(0), b}, {out(0)}, {}});
        return;
      }
      case OpKind::MaxPoolForward:
      case OpKind::AvgPoolForward: {
        const auto& a = std::get<PoolAttrs>(n.attrs);
        const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.kh - a.h - a.pad_h);
        const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.kw - a.w - a.pad_w);
        const bool mx = n.kind == OpKind::MaxPoolForward;
        Node x{mx ? "MaxPool" : "AveragePool", {in(0)}, {out(0)}, {}};
        x.ints("kernel_shape", {a.kh, a.kw}).ints("strides", {a.stride_h, a.stride_w}).ints("pads", {a.pad_h, a.pad_w, pb, pr});
        if (!mx) x.i("count_include_pad", 0);  // Kiln averages over the valid elements
        nodes_.push_back(std::move(x));
        return;
      }
      case OpKind::ActivationForward: {
        const auto act = std::get<ActivationAttrs>(n.attrs).act;
        if (act == Activation::relu) nodes_.push_back(Node{"Relu", {in(0)}, {out(0)}, {}});
        else if (act == Activation::sigmoid) nodes_.push_back(Node{"Sigmoid", {in(0)}, {out(0)}, {}});
        else if (act == Activation::tanh) nodes_.push_back(Node{"Tanh", {in(0)}, {out(0)}, {}});
        else if (act == Activation::silu) {
          nodes_.push_back(Node{"Sigmoid", {in(0)}, {out(0) + "/sig"}, {}});
          nodes_.push_back(Node{"Mul", {in(0), out(0) + "/sig"}, {out(0)}, {}});
        } else {
          refuse(n, "activation " + std::string(activation_name(act)));
        }
        return;
      }
      case OpKind::SoftmaxForward:
        nodes_.push_back(Node{"Softmax", {in(0)}, {out(0)}, {}}.i("axis", -1));
        return;
      case OpKind::Add: {
        const auto& a = std::get<ElementwiseAttrs>(n.attrs);
        if (a.alpha != 1.f || a.beta != 1.f) refuse(n, "a scaled add");
        nodes_.push_back(Node{"Add", {in(0), in(1)}, {out(0)}, {}});
        return;
      }
      case OpKind::Concat: {
        const auto& a = std::get<ConcatAttrs>(n.attrs);
        const Shape& s = g.tensor(n.out[0]).shape;
        int64_t axis = -1, before = 1, total = 0;
        for (auto k : a.sizes) total += k;
        for (size_t d = 0; d < s.rank(); ++d) {
          if (before == a.outer && axis < 0 && d > 0 && s[d] == total) {
            int64_t after = 1;
            for (size_t e = d + 1; e < s.rank(); ++e) after *= s[e];
            if (after == a.inner) axis = static_cast<int64_t>(d);
          }
          before *= s[d];
        }
        if (axis < 0) refuse(n, "this concat");
        Node x{"Concat", {}, {out(0)}, {}};
        for (size_t i = 0; i < n.in.size(); ++i) x.in.push_back(in(i));
        nodes_.push_back(std::move(x.i("axis", axis)));
        return;
      }
      case OpKind::EmbeddingForward: {  // ids travel as floats: Cast to int64, then Gather rows of the table
        nodes_.push_back(Node{"Cast", {in(0)}, {out(0) + "/ids"}, {}}.i("to", kInt64));
        nodes_.push_back(Node{"Gather", {in(1), out(0) + "/ids"}, {out(0)}, {}}.i("axis", 0));
        return;
      }
      case OpKind::Copy:
        nodes_.push_back(Node{"Identity", {in(0)}, {out(0)}, {}});
        return;
      default:
        refuse(n, "op " + std::string(op_name(n.kind)));
    }
  }

  const TrainedModel& m_;
  std::map<TensorId, std::string> names_;
  std::map<TensorId, int> uses_;
  std::vector<Node> nodes_;
  std::vector<Pb> init_;
  TensorId last_fusable_ = kNoTensor;
};

}  // namespace

std::string onnx_model(const TrainedModel& m) { return OnnxWriter(m).write(); }

}  // namespace kiln::app
