// Reverse-mode differentiation of a forward graph by per-op gradient rules. Backward ops are ordinary ops.
#include <map>
#include <set>

#include "kiln/error.hpp"
#include "kiln/graph.hpp"
#include "kiln/op_table.hpp"

namespace kiln {

namespace {

class Differentiator {
 public:
  explicit Differentiator(Graph& g) : g_(g) {}

  void run() {
    const size_t n_forward = g_.nodes().size();
    for (size_t i = 0; i < n_forward; ++i) {
      const Node& n = g_.nodes()[i];
      if (n.kind == OpKind::Cast && role_persistent(g_.tensor(g_.root(n.in[0])).role))
        for (auto o : n.out) weight_copy_of_[g_.root(o)] = g_.root(n.in[0]);
    }
    std::vector<bool> needs(g_.tensors().size(), false);
    for (size_t t = 0; t < g_.tensors().size(); ++t)
      if (g_.tensors()[t].role == TensorRole::parameter) needs[t] = true;
    auto needs_grad = [&](TensorId t) { return needs[static_cast<size_t>(g_.root(t))]; };
    for (size_t i = 0; i < n_forward; ++i) {
      const Node& n = g_.nodes()[i];
      bool any = false;
      for (auto t : n.in) any = any || needs_grad(t);
      if (op_desc(n.kind).is_loss) any = needs_grad(n.in[0]);
      for (auto t : n.out) needs.resize(g_.tensors().size()), needs[static_cast<size_t>(t)] = any;
    }
    needs_ = &needs;
    for (size_t i = n_forward; i-- > 0;) {
      Node n = g_.nodes()[i];         // copy: emitting nodes may reallocate the vector
      if (op_desc(n.kind).is_loss) {  // where backward starts: the fused loss holds its own gradient
        rule(n, {});
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
      rule(n, dys);
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
        TensorId copy = new_tensor(g_.tensor(static_cast<TensorId>(t)).shape, g_.tensor(grad).dtype, dummy);
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
  TensorId new_tensor(const Shape& s, DType type, const Node& like) {
    TensorInfo t;
    t.shape = s;
    t.dtype = type;
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
    n.compute = like.compute;
    n.phase = Phase::backward;
    g_.add_node(std::move(n));
  }

  // Records d as (a part of) the gradient of x; gradients are keyed by storage root, shaped like the root.
  // The type x's gradient is stored in: x's own, except for a 16-bit copy of a float32 parameter (a 16-bit layer's
  // cast before a product), whose gradient is written in float32 straight away (the product accumulates in float32,
  // so the parameter's gradient never passes through 16 bits).
  DType grad_type(TensorId x) const {
    const TensorId r = g_.root(x);
    auto it = weight_copy_of_.find(r);
    return it != weight_copy_of_.end() ? g_.tensor(it->second).dtype : g_.tensor(r).dtype;
  }

  // A gradient is stored in its gradient type: a contribution of another type (a 16-bit layer's gradient of a
  // float32 tensor) is cast first.
  void contribute(TensorId x, TensorId d, const Node& like) {
    TensorId root = g_.root(x);
    if (g_.tensor(d).dtype != grad_type(root)) {
      const DType from = g_.tensor(d).dtype, to = grad_type(root);
      TensorId c = new_tensor(g_.tensor(d).shape, to, like);
      emit(OpKind::Cast, CastAttrs{g_.tensor(d).shape.numel(), from, to}, {d}, {c}, like);
      d = c;
    }
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
      TensorId s = new_tensor(g_.tensor(root).shape, grad_type(root), like);
      emit(OpKind::Add, ElementwiseAttrs{g_.tensor(s).shape.numel(), 1.f, 1.f}, {a, b}, {s}, like);
      parts.push_back(s);
    }
    TensorId d = parts[0];
    if (g_.tensor(x).shape != g_.tensor(d).shape) d = g_.add_alias(d, g_.tensor(x).shape, like.layer);
    return d;
  }

  // What the node's gradient rule (op_table.hpp) sees.
  class Ctx final : public GradContext {
   public:
    Ctx(Differentiator& d, const Node& n, const std::vector<TensorId>& dys) : d_(d), n_(n), dys_(dys) {}
    const Node& node() const override { return n_; }
    TensorId dy(size_t i) const override { return i < dys_.size() ? dys_[i] : kNoTensor; }
    bool needs_grad(TensorId x) const override { return (*d_.needs_)[static_cast<size_t>(d_.g_.root(x))]; }
    Shape shape(TensorId t) const override { return d_.g_.tensor(t).shape; }
    TensorId new_tensor(const Shape& s) override { return d_.new_tensor(s, n_.compute, n_); }
    TensorId new_tensor(const Shape& s, DType t) override { return d_.new_tensor(s, t, n_); }
    DType dtype(TensorId t) const override { return d_.grad_type(t); }
    void emit(OpKind k, OpAttrs a, std::vector<TensorId> in, std::vector<TensorId> out) override {
      d_.emit(k, std::move(a), std::move(in), std::move(out), n_);
    }
    void contribute(TensorId x, TensorId d) override { d_.contribute(x, d, n_); }

   private:
    Differentiator& d_;
    const Node& n_;
    const std::vector<TensorId>& dys_;
  };

  void rule(const Node& n, const std::vector<TensorId>& dys) {
    const OpDesc& d = op_desc(n.kind);
    if (!d.grad)
      throw Error("layer '" + n.layer + "': op '" + d.name +
                  "' has no gradient rule, so a model that trains through it cannot be differentiated");
    Ctx ctx(*this, n, dys);
    d.grad(ctx);
  }

  Graph& g_;
  std::map<TensorId, std::vector<TensorId>> grads_;
  std::set<TensorId> fresh_;
  std::map<TensorId, TensorId> weight_copy_of_;  // 16-bit copy -> the float32 parameter it was cast from
  std::vector<bool>* needs_ = nullptr;
};

}  // namespace

void append_backward(Graph& g) { Differentiator(g).run(); }

}  // namespace kiln
