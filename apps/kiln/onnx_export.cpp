// kiln export --format onnx: the forward graph Kiln evaluates with (build_graph, training = false), node by node, as
// an ONNX model (IR 7, opset 13) written with a small protobuf wire-format encoder (the few fields of onnx.proto
// used here, by field number). The batch dimension is symbolic ("N"); the weights are initializers under Kiln's names.
#include <algorithm>
#include <cmath>
#include <cstdio>
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
constexpr int kFloat = 1, kInt64 = 7;

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
    model_proto.msg(
        8, Pb().bytes(1, "").i64(2, opset_));  // opset_import { domain "", version 13, or 17 with LayerNormalization }
    return model_proto.b;
  }

 private:
  // The ONNX name of a Kiln tensor: parameters keep their names; a view (flatten) becomes a Flatten/Reshape node.
  std::string name(const Graph& g, TensorId t) {
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

  // A float constant (an initializer of shape () named after its value), broadcast by the node that reads it.
  std::string constant(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "const/%.9g", static_cast<double>(v));
    if (consts_.insert(buf).second) init_.push_back(tensor(buf, {}, kFloat, &v, sizeof v));
    return buf;
  }
  std::string int64s(const std::string& n, const std::vector<int64_t>& v) {
    if (consts_.insert(n).second)
      init_.push_back(tensor(n, {static_cast<int64_t>(v.size())}, kInt64, v.data(), v.size() * 8));
    return n;
  }
  // `from` reshaped to `dims`, whose first axis is the batch's (-1: any batch size).
  std::string reshape(const std::string& from, std::vector<int64_t> dims, const std::string& to) {
    dims[0] = -1;
    nodes_.push_back(Node{"Reshape", {from, int64s(to + "/shape", dims)}, {to}, {}});
    return to;
  }

  [[noreturn]] void refuse(const ::kiln::Node& n, const std::string& what) {
    throw ConfigError(
        "--format onnx: layer '" + n.layer + "': " + what +
        " has no ONNX opset 13 form in this exporter (supported: dense, conv2d, max/avg pooling, flatten, "
        "relu/sigmoid/tanh/silu/gelu/softmax activations, dropout, add, concat, embedding, positional_embedding, "
        "layer_norm, batch_norm (evaluation), global_avg_pool2d, attention); export the weights "
        "with --format safetensors instead");
  }

  // The ONNX names of node n's i-th input and output.
  std::string in(const Graph& g, const ::kiln::Node& n, size_t i) { return name(g, n.in[i]); }
  std::string out(const Graph& g, const ::kiln::Node& n, size_t i) { return name(g, n.out[i]); }

  // Node n as ONNX nodes, one emit_* function per op kind.
  void emit(const Graph& g, const ::kiln::Node& n) {
    switch (n.kind) {
      case OpKind::SoftmaxCrossEntropy:
      case OpKind::MeanSquaredError:
      case OpKind::BinaryCrossEntropy:
        return;  // losses: not part of inference
      case OpKind::Gemm:
        return emit_gemm(g, n);
      case OpKind::Conv2dForward:
        return emit_conv(g, n);
      case OpKind::BiasAdd:
        return emit_bias_add(g, n);
      case OpKind::MaxPoolForward:
      case OpKind::AvgPoolForward:
        return emit_pool(g, n);
      case OpKind::ActivationForward:
        return emit_activation(g, n);
      case OpKind::SoftmaxForward:
        return emit_softmax(g, n);
      case OpKind::LayerNormForward:
        return emit_layer_norm(g, n);
      case OpKind::BatchNormForward:
        return emit_batch_norm(g, n);
      case OpKind::Permute:
        return emit_permute(g, n);
      case OpKind::Split:
        return emit_split(g, n);
      case OpKind::BatchedGemm:
        return emit_batched_gemm(g, n);
      case OpKind::Add:
        return emit_add(g, n);
      case OpKind::Concat:
        return emit_concat(g, n);
      case OpKind::EmbeddingForward:
        return emit_embedding(g, n);
      case OpKind::Copy:
        nodes_.push_back(Node{"Identity", {in(g, n, 0)}, {out(g, n, 0)}, {}});
        return;
      default:
        refuse(n, "op " + std::string(op_name(n.kind)));
    }
  }

  void emit_gemm(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<GemmAttrs>(n.attrs);
    if (a.trans_a || a.beta != 0.f || a.alpha != 1.f) refuse(n, "a transposed or scaled gemm");
    if (g.tensor(n.in[0]).shape.rank() == 2) {
      Node x{"Gemm", {in(g, n, 0), in(g, n, 1)}, {out(g, n, 0)}, {}};
      if (a.trans_b) x.i("transB", 1);
      last_fusable_ = n.out[0];
      nodes_.push_back(std::move(x));
    } else {  // (N, T, F) x (F, U): MatMul broadcasts over the leading dims
      std::string w = in(g, n, 1);
      if (a.trans_b) {
        nodes_.push_back(Node{"Transpose", {w}, {w + "/T"}, {}}.ints("perm", {1, 0}));
        w += "/T";
      }
      nodes_.push_back(Node{"MatMul", {in(g, n, 0), w}, {out(g, n, 0)}, {}});
    }
  }

  void emit_conv(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<ConvAttrs>(n.attrs);
    const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.r - a.h - a.pad_h);
    const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.s - a.w - a.pad_w);
    nodes_.push_back(Node{"Conv", {in(g, n, 0), in(g, n, 1)}, {out(g, n, 0)}, {}}
                         .ints("kernel_shape", {a.r, a.s})
                         .ints("strides", {a.stride_h, a.stride_w})
                         .ints("pads", {a.pad_h, a.pad_w, pb, pr}));
    last_fusable_ = n.out[0];
  }

  void emit_bias_add(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<BiasAttrs>(n.attrs);
    // Gemm and Conv take the bias as their third input when nothing else reads their output.
    if (n.in[0] == last_fusable_ && uses_[n.in[0]] == 1 && !nodes_.empty() && nodes_.back().in.size() == 2 &&
        (nodes_.back().op == "Gemm" || nodes_.back().op == "Conv") && g.tensor(n.in[1]).shape.rank() == 1) {
      nodes_.back().in.push_back(in(g, n, 1));
      nodes_.back().out[0] = out(g, n, 0);
      return;
    }
    std::string b = in(g, n, 1);
    if (a.inner > 1) {  // (C) -> (C, 1, ..., 1) to broadcast over the trailing dims
      std::vector<int64_t> dims{a.channels};
      dims.resize(g.tensor(n.in[0]).shape.rank() - 1, 1);
      init_.push_back(tensor(b + "/bshape", {static_cast<int64_t>(dims.size())}, kInt64, dims.data(), dims.size() * 8));
      nodes_.push_back(Node{"Reshape", {b, b + "/bshape"}, {b + "/b"}, {}});
      b += "/b";
    }
    nodes_.push_back(Node{"Add", {in(g, n, 0), b}, {out(g, n, 0)}, {}});
  }

  void emit_pool(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<PoolAttrs>(n.attrs);
    const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.kh - a.h - a.pad_h);
    const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.kw - a.w - a.pad_w);
    const bool mx = n.kind == OpKind::MaxPoolForward;
    Node x{mx ? "MaxPool" : "AveragePool", {in(g, n, 0)}, {out(g, n, 0)}, {}};
    x.ints("kernel_shape", {a.kh, a.kw})
        .ints("strides", {a.stride_h, a.stride_w})
        .ints("pads", {a.pad_h, a.pad_w, pb, pr});
    if (!mx) x.i("count_include_pad", 0);  // Kiln averages over the valid elements
    nodes_.push_back(std::move(x));
  }

  void emit_activation(const Graph& g, const ::kiln::Node& n) {
    const auto act = std::get<ActivationAttrs>(n.attrs).act;
    if (act == Activation::relu)
      nodes_.push_back(Node{"Relu", {in(g, n, 0)}, {out(g, n, 0)}, {}});
    else if (act == Activation::sigmoid)
      nodes_.push_back(Node{"Sigmoid", {in(g, n, 0)}, {out(g, n, 0)}, {}});
    else if (act == Activation::tanh)
      nodes_.push_back(Node{"Tanh", {in(g, n, 0)}, {out(g, n, 0)}, {}});
    else if (act == Activation::silu) {
      nodes_.push_back(Node{"Sigmoid", {in(g, n, 0)}, {out(g, n, 0) + "/sig"}, {}});
      nodes_.push_back(Node{"Mul", {in(g, n, 0), out(g, n, 0) + "/sig"}, {out(g, n, 0)}, {}});
    } else if (act == Activation::gelu) {  // 0.5 x (1 + erf(x / sqrt 2))
      const std::string o = out(g, n, 0);
      nodes_.push_back(Node{"Mul", {in(g, n, 0), constant(static_cast<float>(1 / std::sqrt(2.0)))}, {o + "/s"}, {}});
      nodes_.push_back(Node{"Erf", {o + "/s"}, {o + "/erf"}, {}});
      nodes_.push_back(Node{"Add", {o + "/erf", constant(1.f)}, {o + "/1p"}, {}});
      nodes_.push_back(Node{"Mul", {in(g, n, 0), o + "/1p"}, {o + "/x1p"}, {}});
      nodes_.push_back(Node{"Mul", {o + "/x1p", constant(0.5f)}, {o}, {}});
    } else if (act == Activation::gelu_tanh) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const std::string o = out(g, n, 0), x = in(g, n, 0);
      nodes_.push_back(Node{"Mul", {x, x}, {o + "/x2"}, {}});
      nodes_.push_back(Node{"Mul", {o + "/x2", x}, {o + "/x3"}, {}});
      nodes_.push_back(Node{"Mul", {o + "/x3", constant(0.044715f)}, {o + "/cx3"}, {}});
      nodes_.push_back(Node{"Add", {x, o + "/cx3"}, {o + "/in"}, {}});
      nodes_.push_back(Node{"Mul", {o + "/in", constant(static_cast<float>(std::sqrt(2.0 / M_PI)))}, {o + "/k"}, {}});
      nodes_.push_back(Node{"Tanh", {o + "/k"}, {o + "/t"}, {}});
      nodes_.push_back(Node{"Add", {o + "/t", constant(1.f)}, {o + "/1p"}, {}});
      nodes_.push_back(Node{"Mul", {x, o + "/1p"}, {o + "/x1p"}, {}});
      nodes_.push_back(Node{"Mul", {o + "/x1p", constant(0.5f)}, {o}, {}});
    } else {
      refuse(n, "activation " + std::string(activation_name(act)));
    }
  }

  void emit_softmax(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<SoftmaxAttrs>(n.attrs);
    const Shape& xs = g.tensor(n.in[0]).shape;
    if (xs.rank() < 2 || xs[xs.rank() - 1] != a.cols) refuse(n, "a softmax over other than the last axis");
    std::string x = in(g, n, 0);
    if (a.causal) {  // (..., T, T) + a (T, T) mask of 0 on and below the diagonal, -inf above: exactly 0 there
      if (xs[xs.rank() - 2] != a.cols) refuse(n, "a causal softmax over a non-square block");
      std::vector<float> mask(static_cast<size_t>(a.cols * a.cols), 0.f);
      for (int64_t r = 0; r < a.cols; ++r)
        for (int64_t c = r + 1; c < a.cols; ++c) mask[static_cast<size_t>(r * a.cols + c)] = -INFINITY;
      const std::string m = "causal_mask/" + std::to_string(a.cols);
      if (consts_.insert(m).second) init_.push_back(tensor(m, {a.cols, a.cols}, kFloat, mask.data(), mask.size() * 4));
      nodes_.push_back(Node{"Add", {x, m}, {out(g, n, 0) + "/masked"}, {}});
      x = out(g, n, 0) + "/masked";
    }
    nodes_.push_back(Node{"Softmax", {x}, {out(g, n, 0)}, {}}.i("axis", -1));
  }

  // LayerNormalization (opset 17) over the last axis.
  void emit_layer_norm(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<LayerNormAttrs>(n.attrs);
    const Shape& xs = g.tensor(n.in[0]).shape;
    if (xs[xs.rank() - 1] != a.cols) refuse(n, "a layer norm over other than the last axis");
    Node x{"LayerNormalization", {in(g, n, 0), in(g, n, 1)}, {out(g, n, 0)}, {}};
    if (a.bias) x.in.push_back(in(g, n, 2));
    nodes_.push_back(std::move(x.i("axis", -1).f("epsilon", a.eps)));
    opset_ = std::max(opset_, 17);
  }

  // Batch norm in evaluation: the running statistics.
  void emit_batch_norm(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<BatchNormAttrs>(n.attrs);
    if (a.training) refuse(n, "a batch norm in training mode");
    const Shape& xs = g.tensor(n.in[0]).shape;
    if (xs.rank() < 2 || xs[1] != a.c) refuse(n, "a batch norm whose channels are not axis 1");
    nodes_.push_back(Node{
        "BatchNormalization",
        {in(g, n, 0), in(g, n, 1), in(g, n, 2), name(g, n.out[3]), name(g, n.out[4])},
        {out(g, n, 0)},
        {}}.f("epsilon", a.eps));
  }

  // Permute: the view's dims (batch first), then Transpose; the output keeps Kiln's shape.
  void emit_permute(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<PermuteAttrs>(n.attrs);
    std::vector<int64_t> dims(a.dims.begin(), a.dims.begin() + a.rank), perm(a.perm.begin(), a.perm.begin() + a.rank);
    const std::string v = reshape(in(g, n, 0), dims, out(g, n, 0) + "/view");
    nodes_.push_back(Node{"Transpose", {v}, {out(g, n, 0) + "/t"}, {}}.ints("perm", perm));
    std::vector<int64_t> od(static_cast<size_t>(a.rank));
    for (int64_t i = 0; i < a.rank; ++i)
      od[static_cast<size_t>(i)] = dims[static_cast<size_t>(perm[static_cast<size_t>(i)])];
    const Shape& ys = g.tensor(n.out[0]).shape;
    if (perm[0] == 0) {
      reshape(out(g, n, 0) + "/t", ys.dims(), out(g, n, 0));
    } else if (ys.dims() == od) {  // the batch moved off axis 0: the output is the transposed view as it is
      nodes_.push_back(Node{"Identity", {out(g, n, 0) + "/t"}, {out(g, n, 0)}, {}});
    } else {
      refuse(n, "a permute that moves the batch axis and reshapes");
    }
  }

  // Split, attention's q, k, v: equal parts of axis 0, each with that axis dropped.
  void emit_split(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<ConcatAttrs>(n.attrs);
    const Shape& xs = g.tensor(n.in[0]).shape;
    if (a.outer != 1 || static_cast<int64_t>(n.out.size()) != xs[0])
      refuse(n, "a split other than into the parts of the first axis");
    for (size_t i = 0; i < n.out.size(); ++i) {  // Gather with a scalar index drops the axis
      const std::string idx = "index/" + std::to_string(i);
      const int64_t v = static_cast<int64_t>(i);
      if (consts_.insert(idx).second) init_.push_back(tensor(idx, {}, kInt64, &v, sizeof v));
      nodes_.push_back(Node{"Gather", {in(g, n, 0), idx}, {out(g, n, i)}, {}}.i("axis", 0));
    }
  }

  // MatMul over the leading axes (Kiln's tensors are (batch, ..., rows, cols)).
  void emit_batched_gemm(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<GemmAttrs>(n.attrs);
    if (a.beta != 0.f) refuse(n, "a batched gemm that accumulates");
    auto operand = [&](size_t i, int64_t rows, int64_t cols, bool trans) {
      const Shape& sh = g.tensor(n.in[i]).shape;
      std::string v = in(g, n, i);
      if (sh.rank() < 3 || sh[sh.rank() - 2] != rows || sh[sh.rank() - 1] != cols)
        refuse(n, "a batched gemm whose operands are not (..., rows, cols)");
      if (trans) {
        std::vector<int64_t> perm(sh.rank());
        for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
        std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
        nodes_.push_back(Node{"Transpose", {v}, {v + "/T"}, {}}.ints("perm", perm));
        v += "/T";
      }
      return v;
    };
    const std::string A = a.trans_a ? operand(0, a.k, a.m, true) : operand(0, a.m, a.k, false);
    const std::string B = a.trans_b ? operand(1, a.n, a.k, true) : operand(1, a.k, a.n, false);
    if (a.alpha == 1.f) {
      nodes_.push_back(Node{"MatMul", {A, B}, {out(g, n, 0)}, {}});
    } else {
      nodes_.push_back(Node{"MatMul", {A, B}, {out(g, n, 0) + "/mm"}, {}});
      nodes_.push_back(Node{"Mul", {out(g, n, 0) + "/mm", constant(a.alpha)}, {out(g, n, 0)}, {}});
    }
  }

  void emit_add(const Graph& g, const ::kiln::Node& n) {
    const auto& a = std::get<ElementwiseAttrs>(n.attrs);
    if (a.alpha != 1.f || a.beta != 1.f) refuse(n, "a scaled add");
    nodes_.push_back(Node{"Add", {in(g, n, 0), in(g, n, 1)}, {out(g, n, 0)}, {}});
  }

  void emit_concat(const Graph& g, const ::kiln::Node& n) {
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
    Node x{"Concat", {}, {out(g, n, 0)}, {}};
    for (size_t i = 0; i < n.in.size(); ++i) x.in.push_back(in(g, n, i));
    nodes_.push_back(std::move(x.i("axis", axis)));
  }

  // Embedding: ids travel as floats; Cast to int64, then Gather rows of the table.
  void emit_embedding(const Graph& g, const ::kiln::Node& n) {
    nodes_.push_back(Node{"Cast", {in(g, n, 0)}, {out(g, n, 0) + "/ids"}, {}}.i("to", kInt64));
    nodes_.push_back(Node{"Gather", {in(g, n, 1), out(g, n, 0) + "/ids"}, {out(g, n, 0)}, {}}.i("axis", 0));
  }

  const TrainedModel& m_;
  std::map<TensorId, std::string> names_;
  std::map<TensorId, int> uses_;
  std::vector<Node> nodes_;
  std::vector<Pb> init_;
  TensorId last_fusable_ = kNoTensor;
  std::set<std::string> consts_;
  int opset_ = 13;
};

}  // namespace

std::string onnx_model(const TrainedModel& m) { return OnnxWriter(m).write(); }

}  // namespace kiln::app
