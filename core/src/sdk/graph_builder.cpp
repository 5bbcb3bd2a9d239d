// GraphBuilder::op and its casts: where a layer's ops get their storage types from the precision policy (the op
// table says which inputs a 16-bit layer casts and which outputs stay float32). Apart from graph.cpp because it
// reads the op table, which itself builds on the graph.
#include <algorithm>
#include <tuple>

#include "kiln/graph.hpp"
#include "kiln/op_table.hpp"

namespace kiln {

std::vector<TensorId> GraphBuilder::op(OpKind kind, OpAttrs attrs, std::vector<TensorId> in,
                                       std::vector<Shape> out_shapes) {
  const OpDesc& d = op_desc(kind);
  if (compute_ != DType::f32)
    for (int i : d.low_precision)
      if (static_cast<size_t>(i) < in.size()) in[static_cast<size_t>(i)] = cast(in[static_cast<size_t>(i)], compute_);
  Node n;
  n.kind = kind;
  n.attrs = std::move(attrs);
  n.in = std::move(in);
  n.layer = layer_;
  n.phase = Phase::forward;
  n.device = device_;
  n.compute = compute_;
  auto listed = [](const std::vector<int>& v, size_t i) {
    return std::find(v.begin(), v.end(), static_cast<int>(i)) != v.end();
  };
  for (size_t i = 0; i < out_shapes.size(); ++i) {
    TensorInfo t;
    t.shape = std::move(out_shapes[i]);
    t.role = TensorRole::activation;
    t.layer = layer_;
    t.device = device_;
    t.dtype = compute_;
    if (listed(d.f32_outputs, i) || listed(d.saved_outputs, i) || (d.is_loss && i == 0)) t.dtype = DType::f32;
    if (d.is_loss && i == 1 && !n.in.empty()) t.dtype = g_.tensor(n.in[0]).dtype;  // the prediction's gradient
    n.out.push_back(g_.add_tensor(std::move(t)));
  }
  auto outs = n.out;
  g_.add_node(std::move(n));
  return outs;
}

TensorId GraphBuilder::cast(TensorId x, DType t) {
  const TensorInfo& xi = g_.tensor(x);
  if (xi.dtype == t) return x;
  const auto key = std::make_tuple(x, t, device_);
  if (auto it = casts_.find(key); it != casts_.end()) return it->second;
  Node n;
  n.kind = OpKind::Cast;
  n.attrs = CastAttrs{xi.shape.numel(), xi.dtype, t};
  n.in = {x};
  n.layer = layer_;
  n.phase = Phase::forward;
  n.device = device_;
  n.compute = compute_;
  TensorInfo y;
  y.shape = xi.shape;
  y.role = TensorRole::activation;
  y.layer = layer_;
  y.device = device_;
  y.dtype = t;
  const TensorId out = g_.add_tensor(std::move(y));
  n.out = {out};
  g_.add_node(std::move(n));
  casts_.emplace(key, out);
  return out;
}

}  // namespace kiln
