// Reverse-mode differentiation of a forward graph by per-op gradient rules. Backward ops are ordinary ops.
#include <map>
#include <set>

#include "kiln/error.hpp"
#include "kiln/graph.hpp"

namespace kiln {

namespace {

class Differentiator {
 public:
  explicit Differentiator(Graph& g) : g_(g) {}

  void run() {
    const size_t n_forward = g_.nodes().size();
    std::vector<bool> needs(g_.tensors().size(), false);
    for (size_t t = 0; t < g_.tensors().size(); ++t)
      if (g_.tensors()[t].role == TensorRole::parameter) needs[t] = true;
    auto needs_grad = [&](TensorId t) { return needs[static_cast<size_t>(g_.root(t))]; };
    for (size_t i = 0; i < n_forward; ++i) {
      const Node& n = g_.nodes()[i];
      bool any = false;
      for (auto t : n.in) any = any || needs_grad(t);
      if (is_loss(n.kind)) any = needs_grad(n.in[0]);
      for (auto t : n.out) needs.resize(g_.tensors().size()), needs[static_cast<size_t>(t)] = any;
    }
    needs_ = &needs;
    for (size_t i = n_forward; i-- > 0;) {
      Node n = g_.nodes()[i];  // copy: emitting nodes may reallocate the vector
      if (is_loss(n.kind)) {
        if (needs_grad(n.in[0])) contribute(n.in[0], n.out[1], n);
        continue;
      }
      std::vector<TensorId> dys;
      bool any = false;
      for (auto o : n.out) {
        TensorId d = gather(o, n);
        dys.push_back(d);
        any = any || d != kNoTensor;
      }
      if (!any) continue;
      rule(n, dys, needs_grad);
    }
    // Parameter gradients, in parameter order.
    for (size_t t = 0; t < g_.tensors().size(); ++t) {
      if (g_.tensors()[t].role != TensorRole::parameter || g_.tensors()[t].alias_of != kNoTensor) continue;
      Node dummy;
      dummy.layer = g_.tensors()[t].layer;
      dummy.device = g_.tensors()[t].device;
      TensorId grad = gather(static_cast<TensorId>(t), dummy);
      if (grad == kNoTensor) continue;  // unused parameter
      if (!fresh_.count(grad) || g_.tensor(grad).alias_of != kNoTensor) {
        TensorId copy = new_tensor(g_.tensor(static_cast<TensorId>(t)).shape, dummy);
        emit(OpKind::Copy, ElementwiseAttrs{g_.tensor(copy).shape.numel()}, {grad}, {copy}, dummy);
        grad = copy;
      }
      auto& gi = g_.tensor(grad);
      gi.role = TensorRole::gradient;
      gi.name = g_.tensors()[t].name + ".grad";
      g_.param_grads.push_back({static_cast<TensorId>(t), grad});
    }
  }

 private:
  static bool is_loss(OpKind k) {
    return k == OpKind::SoftmaxCrossEntropy || k == OpKind::MeanSquaredError || k == OpKind::BinaryCrossEntropy;
  }

  TensorId new_tensor(const Shape& s, const Node& like) {
    TensorInfo t;
    t.shape = s;
    t.role = TensorRole::activation;
    t.layer = like.layer;
    t.device = like.device;
    TensorId id = g_.add_tensor(std::move(t));
    fresh_.insert(id);
    return id;
  }

  void emit(OpKind k, OpAttrs a, std::vector<TensorId> in, std::vector<TensorId> out, const Node& like) {
    Node n;
    n.kind = k;
    n.attrs = std::move(a);
    n.in = std::move(in);
    n.out = std::move(out);
    n.layer = like.layer;
    n.device = like.device;
    n.phase = Phase::backward;
    g_.add_node(std::move(n));
  }

  // Records d as (a part of) the gradient of x; gradients are keyed by storage root, shaped like the root.
  void contribute(TensorId x, TensorId d, const Node& like) {
    TensorId root = g_.root(x);
    if (g_.tensor(d).shape != g_.tensor(root).shape) d = g_.add_alias(d, g_.tensor(root).shape, like.layer);
    grads_[root].push_back(d);
  }

  // The total gradient of x (summing contributions), shaped like x; kNoTensor when x does not affect the loss.
  TensorId gather(TensorId x, const Node& like) {
    TensorId root = g_.root(x);
    auto it = grads_.find(root);
    if (it == grads_.end() || it->second.empty()) return kNoTensor;
    auto& parts = it->second;
    while (parts.size() > 1) {
      TensorId a = parts[parts.size() - 1], b = parts[parts.size() - 2];
      parts.resize(parts.size() - 2);
      TensorId s = new_tensor(g_.tensor(root).shape, like);
      emit(OpKind::Add, ElementwiseAttrs{g_.tensor(s).shape.numel(), 1.f, 1.f}, {a, b}, {s}, like);
      parts.push_back(s);
    }
    TensorId d = parts[0];
    if (g_.tensor(x).shape != g_.tensor(d).shape) d = g_.add_alias(d, g_.tensor(x).shape, like.layer);
    return d;
  }

  template <class NeedsGrad>
  void rule(const Node& n, const std::vector<TensorId>& dys, NeedsGrad needs_grad) {
    const TensorId dy = dys[0];
    auto shape = [&](TensorId t) { return g_.tensor(t).shape; };
    switch (n.kind) {
      case OpKind::Gemm: {
        auto a = std::get<GemmAttrs>(n.attrs);
        if (a.beta != 0.f) throw Error("layer '" + n.layer + "': gemm with beta != 0 has no gradient rule");
        TensorId A = n.in[0], B = n.in[1];
        if (needs_grad(A)) {
          TensorId dA = new_tensor(shape(A), n);
          GemmAttrs ga;
          if (!a.trans_a) ga = {a.m, a.k, a.n, false, !a.trans_b, a.alpha, 0.f}, emit(OpKind::Gemm, ga, {dy, B}, {dA}, n);
          else ga = {a.k, a.m, a.n, a.trans_b, true, a.alpha, 0.f}, emit(OpKind::Gemm, ga, {B, dy}, {dA}, n);
          contribute(A, dA, n);
        }
        if (needs_grad(B)) {
          TensorId dB = new_tensor(shape(B), n);
          GemmAttrs gb;
          if (!a.trans_b) gb = {a.k, a.n, a.m, !a.trans_a, false, a.alpha, 0.f}, emit(OpKind::Gemm, gb, {A, dy}, {dB}, n);
          else gb = {a.n, a.k, a.m, true, a.trans_a, a.alpha, 0.f}, emit(OpKind::Gemm, gb, {dy, A}, {dB}, n);
          contribute(B, dB, n);
        }
        break;
      }
      case OpKind::BiasAdd: {
        if (needs_grad(n.in[0])) contribute(n.in[0], dy, n);
        if (needs_grad(n.in[1])) {
          TensorId db = new_tensor(shape(n.in[1]), n);
          emit(OpKind::BiasGrad, n.attrs, {dy}, {db}, n);
          contribute(n.in[1], db, n);
        }
        break;
      }
      case OpKind::Conv2dForward: {
        if (needs_grad(n.in[0])) {
          TensorId dx = new_tensor(shape(n.in[0]), n);
          emit(OpKind::Conv2dBackwardData, n.attrs, {dy, n.in[1]}, {dx}, n);
          contribute(n.in[0], dx, n);
        }
        if (needs_grad(n.in[1])) {
          TensorId dw = new_tensor(shape(n.in[1]), n);
          emit(OpKind::Conv2dBackwardFilter, n.attrs, {n.in[0], dy}, {dw}, n);
          contribute(n.in[1], dw, n);
        }
        break;
      }
      case OpKind::MaxPoolForward:
      case OpKind::AvgPoolForward: {
        if (!needs_grad(n.in[0])) break;
        TensorId dx = new_tensor(shape(n.in[0]), n);
        if (n.kind == OpKind::MaxPoolForward) emit(OpKind::MaxPoolBackward, n.attrs, {n.in[0], n.out[0], dy}, {dx}, n);
        else emit(OpKind::AvgPoolBackward, n.attrs, {dy}, {dx}, n);
        contribute(n.in[0], dx, n);
        break;
      }
      case OpKind::ActivationForward:
      case OpKind::SoftmaxForward: {
        if (!needs_grad(n.in[0])) break;
        TensorId dx = new_tensor(shape(n.in[0]), n);
        emit(n.kind == OpKind::ActivationForward ? OpKind::ActivationBackward : OpKind::SoftmaxBackward, n.attrs,
             {n.out[0], dy}, {dx}, n);
        contribute(n.in[0], dx, n);
        break;
      }
      case OpKind::DropoutForward: {
        if (!needs_grad(n.in[0])) break;
        TensorId dx = new_tensor(shape(n.in[0]), n);
        emit(OpKind::DropoutBackward, n.attrs, {dy}, {dx}, n);
        contribute(n.in[0], dx, n);
        break;
      }
      case OpKind::Add: {
        auto a = std::get<ElementwiseAttrs>(n.attrs);
        float coef[2] = {a.alpha, a.beta};
        for (int i = 0; i < 2; ++i) {
          if (!needs_grad(n.in[i])) continue;
          if (coef[i] == 1.f) {
            contribute(n.in[i], dy, n);
          } else {
            TensorId d = new_tensor(shape(n.in[i]), n);
            emit(OpKind::Scale, ElementwiseAttrs{a.count, coef[i], 0.f}, {dy}, {d}, n);
            contribute(n.in[i], d, n);
          }
        }
        break;
      }
      case OpKind::Mul: {
        for (int i = 0; i < 2; ++i) {
          if (!needs_grad(n.in[i])) continue;
          TensorId d = new_tensor(shape(n.in[i]), n);
          emit(OpKind::Mul, n.attrs, {dy, n.in[1 - i]}, {d}, n);
          contribute(n.in[i], d, n);
        }
        break;
      }
      case OpKind::Scale:
      case OpKind::Copy: {
        if (!needs_grad(n.in[0])) break;
        auto a = std::get<ElementwiseAttrs>(n.attrs);
        if (n.kind == OpKind::Copy || a.alpha == 1.f) {
          contribute(n.in[0], dy, n);
        } else {
          TensorId d = new_tensor(shape(n.in[0]), n);
          emit(OpKind::Scale, a, {dy}, {d}, n);
          contribute(n.in[0], d, n);
        }
        break;
      }
      case OpKind::Concat: {
        std::vector<TensorId> parts;
        for (auto x : n.in) parts.push_back(new_tensor(shape(x), n));
        emit(OpKind::Split, n.attrs, {dy}, parts, n);
        for (size_t i = 0; i < n.in.size(); ++i)
          if (needs_grad(n.in[i])) contribute(n.in[i], parts[i], n);
        break;
      }
      case OpKind::Split: {
        std::vector<TensorId> parts;
        for (size_t i = 0; i < n.out.size(); ++i) {
          TensorId d = dys[i];
          if (d == kNoTensor) {
            d = new_tensor(shape(n.out[i]), n);
            emit(OpKind::Fill, ElementwiseAttrs{shape(n.out[i]).numel(), 0.f, 0.f}, {}, {d}, n);
          }
          parts.push_back(d);
        }
        TensorId dx = new_tensor(shape(n.in[0]), n);
        emit(OpKind::Concat, n.attrs, parts, {dx}, n);
        if (needs_grad(n.in[0])) contribute(n.in[0], dx, n);
        break;
      }
      default:
        throw Error("layer '" + n.layer + "': op '" + std::string(op_name(n.kind)) +
                    "' has no gradient rule, so a model that trains through it cannot be differentiated");
    }
  }

  Graph& g_;
  std::map<TensorId, std::vector<TensorId>> grads_;
  std::set<TensorId> fresh_;
  std::vector<bool>* needs_ = nullptr;
};

}  // namespace

void append_backward(Graph& g) { Differentiator(g).run(); }

}  // namespace kiln
