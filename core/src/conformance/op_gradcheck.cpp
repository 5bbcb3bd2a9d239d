// Case data generation shared by the conformance runner and the gradient check, and the finite-difference
// check of an op's gradient rule on the reference implementation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "conformance_impl.hpp"
#include "kiln/conformance.hpp"
#include "kiln/error.hpp"
#include "kiln/op_table.hpp"
#include "kiln/reference.hpp"

namespace kiln {

void generate_case_data(const Gen& g, std::vector<float>& v, std::mt19937& rng, int64_t rows) {
  switch (g.kind) {
    case Gen::sentinel: {
      float f;
      std::memcpy(&f, &kUnwrittenBits, 4);
      std::fill(v.begin(), v.end(), f);
      return;
    }
    case Gen::ints: {
      std::uniform_int_distribution<int> d(static_cast<int>(g.lo), static_cast<int>(g.hi));
      for (auto& x : v) x = static_cast<float>(d(rng));
      return;
    }
    case Gen::uniform: {
      std::uniform_real_distribution<float> d(g.lo, g.hi);
      for (auto& x : v) x = d(rng);
      return;
    }
    case Gen::labels:
    case Gen::labels_bad: {
      std::uniform_int_distribution<int> d(0, static_cast<int>(g.hi) - 1);
      for (auto& x : v) x = static_cast<float>(d(rng));
      if (g.kind == Gen::labels_bad && !v.empty()) v[0] = g.hi;
      (void)rows;
      return;
    }
    case Gen::spread: {
      std::vector<size_t> perm(v.size());
      std::iota(perm.begin(), perm.end(), size_t{0});
      std::shuffle(perm.begin(), perm.end(), rng);
      const double n = static_cast<double>(v.size());
      for (size_t j = 0; j < v.size(); ++j)
        v[j] = static_cast<float>(g.lo + (double(g.hi) - g.lo) * (static_cast<double>(perm[j]) + 0.5) / n);
      return;
    }
    case Gen::max_pool_y:
      return;  // filled from input 0 by the caller
  }
}

namespace {

// Buffers by id; the rule's backward ops are recorded and then run on the reference.
class HostGrad final : public GradContext {
 public:
  HostGrad(Node n, std::vector<std::vector<float>>& bufs, std::vector<TensorId> dys, std::vector<bool> needs)
      : n_(std::move(n)), bufs_(bufs), dys_(std::move(dys)), needs_(std::move(needs)) {}
  const Node& node() const override { return n_; }
  TensorId dy(size_t i) const override { return i < dys_.size() ? dys_[i] : kNoTensor; }
  bool needs_grad(TensorId x) const override {
    for (size_t i = 0; i < n_.in.size(); ++i)
      if (n_.in[i] == x) return needs_[i];
    return false;
  }
  Shape shape(TensorId t) const override { return Shape{static_cast<int64_t>(bufs_[static_cast<size_t>(t)].size())}; }
  TensorId new_tensor(const Shape& s) override {
    bufs_.emplace_back(static_cast<size_t>(s.numel()), 0.f);
    return static_cast<TensorId>(bufs_.size() - 1);
  }
  // Gradient checks run in float32: every buffer here is.
  TensorId new_tensor(const Shape& s, DType) override { return new_tensor(s); }
  DType dtype(TensorId) const override { return DType::f32; }
  void emit(OpKind k, OpAttrs a, std::vector<TensorId> in, std::vector<TensorId> out) override {
    Node n;
    n.kind = k;
    n.attrs = std::move(a);
    n.in = std::move(in);
    n.out = std::move(out);
    ops_.push_back(std::move(n));
  }
  void contribute(TensorId x, TensorId d) override { parts_.emplace_back(x, d); }

  void run() {
    for (const Node& n : ops_) {
      std::vector<const float*> in;
      std::vector<float*> out;
      for (auto t : n.in) in.push_back(bufs_[static_cast<size_t>(t)].data());
      for (auto t : n.out) out.push_back(bufs_[static_cast<size_t>(t)].data());
      reference_op(n.kind, n.attrs, in, out);
    }
  }
  // The summed gradient of x, or empty when the rule contributed nothing.
  std::vector<float> grad(TensorId x) const {
    std::vector<float> g;
    for (auto [t, d] : parts_) {
      if (t != x) continue;
      const auto& v = bufs_[static_cast<size_t>(d)];
      if (g.empty()) g.assign(v.size(), 0.f);
      for (size_t i = 0; i < v.size() && i < g.size(); ++i) g[i] += v[i];
    }
    return g;
  }

 private:
  Node n_;
  std::vector<std::vector<float>>& bufs_;
  std::vector<TensorId> dys_;
  std::vector<bool> needs_;
  std::vector<Node> ops_;
  std::vector<std::pair<TensorId, TensorId>> parts_;
};

uint32_t id_seed(const std::string& id) {
  uint32_t h = 2166136261u;
  for (char c : id) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

}  // namespace

std::string check_gradient(const OpCase& c, double eps, double rtol, double atol) {
  const OpDesc& d = op_desc(c.kind);
  if (!d.grad) return "op " + d.name + " has no gradient rule";
  const OpArity ar = d.arity(c.attrs);
  if (c.in.size() != ar.in.size())
    return "the case has " + std::to_string(c.in.size()) + " input generators, the op " + std::to_string(ar.in.size()) +
           " inputs";
  std::mt19937 rng(id_seed(c.id));
  const size_t ni = ar.in.size(), no = ar.out.size();
  // Buffers: inputs [0, ni), outputs [ni, ni+no), output weights [ni+no, ni+2no); rule's tensors after.
  std::vector<std::vector<float>> bufs;
  for (size_t i = 0; i < ni; ++i) {
    bufs.emplace_back(static_cast<size_t>(ar.in[i]));
    generate_case_data(c.in[i], bufs.back(), rng, ar.in.size() > 1 ? ar.in[1] : 0);
  }
  for (size_t o = 0; o < no; ++o) bufs.emplace_back(static_cast<size_t>(ar.out[o]), 0.f);
  std::uniform_real_distribution<float> wd(-1.f, 1.f);
  for (size_t o = 0; o < no; ++o) {
    bufs.emplace_back(static_cast<size_t>(ar.out[o]));
    const bool saved =
        std::find(d.saved_outputs.begin(), d.saved_outputs.end(), static_cast<int>(o)) != d.saved_outputs.end();
    for (auto& w : bufs.back()) w = saved ? 0.f : wd(rng);
  }
  auto forward = [&](std::vector<std::vector<float>>& b) {
    std::vector<const float*> in;
    std::vector<float*> out;
    for (size_t i = 0; i < ni; ++i) in.push_back(b[i].data());
    for (size_t o = 0; o < no; ++o) out.push_back(b[ni + o].data());
    reference_op(c.kind, c.attrs, in, out);
  };
  // L = sum_o w_o . y_o, or the fused loss's own value.
  auto objective = [&](const std::vector<std::vector<float>>& b) {
    if (d.is_loss) return static_cast<double>(b[ni][0]);
    double l = 0;
    for (size_t o = 0; o < no; ++o)
      for (size_t j = 0; j < b[ni + o].size(); ++j) l += double(b[ni + no + o][j]) * b[ni + o][j];
    return l;
  };
  forward(bufs);

  Node n;
  n.kind = c.kind;
  n.attrs = c.attrs;
  n.layer = "gradcheck";
  for (size_t i = 0; i < ni; ++i) n.in.push_back(static_cast<TensorId>(i));
  for (size_t o = 0; o < no; ++o) n.out.push_back(static_cast<TensorId>(ni + o));
  std::vector<TensorId> dys;
  for (size_t o = 0; o < no; ++o) dys.push_back(static_cast<TensorId>(ni + no + o));
  std::vector<bool> needs(ni, true);
  for (int i : d.data_inputs)  // labels, targets and ids are data
    if (i >= 0 && static_cast<size_t>(i) < ni) needs[static_cast<size_t>(i)] = false;
  HostGrad ctx(n, bufs, d.is_loss ? std::vector<TensorId>{} : dys, needs);
  d.grad(ctx);
  ctx.run();

  std::ostringstream why;
  bool any = false;
  for (size_t i = 0; i < ni; ++i) {
    if (!needs[i]) continue;
    const std::vector<float> g = ctx.grad(static_cast<TensorId>(i));
    if (g.empty()) {
      why << "input " << i << ": the rule gives no gradient";
      return why.str();
    }
    any = true;
    std::vector<std::vector<float>> b = bufs;
    // At most 64 elements per input, spread over the buffer.
    const size_t count = b[i].size(), step = std::max<size_t>(1, count / 64);
    for (size_t j = 0; j < count; j += step) {
      const float x0 = bufs[i][j];
      b[i][j] = static_cast<float>(x0 + eps);
      forward(b);
      const double up = objective(b);
      b[i][j] = static_cast<float>(x0 - eps);
      forward(b);
      const double down = objective(b);
      b[i][j] = x0;
      const double fd = (up - down) / (double(static_cast<float>(x0 + eps)) - double(static_cast<float>(x0 - eps)));
      if (std::abs(fd - g[j]) > atol + rtol * std::abs(fd)) {
        why << "input " << i << " element " << j << ": rule " << g[j] << ", finite differences " << fd;
        return why.str();
      }
    }
  }
  if (!any) return "no input of the case needs a gradient";
  return {};
}

}  // namespace kiln
