// 2-D convolution (NCHW, filters KCRS): forward, and its backward data and filter ops. Semantics: ops.hpp.
// Also the conv2d layer that emits it.
#include <algorithm>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity conv_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<ConvAttrs>(op, attrs);
  check_dims(op, {{"n", a.n},
                  {"c", a.c},
                  {"h", a.h},
                  {"w", a.w},
                  {"k", a.k},
                  {"r", a.r},
                  {"s", a.s},
                  {"pad_h", a.pad_h},
                  {"pad_w", a.pad_w},
                  {"oh", a.oh},
                  {"ow", a.ow}});
  check_strides(op, a.stride_h, a.stride_w);
  const int64_t x = product(op, {a.n, a.c, a.h, a.w}), w = product(op, {a.k, a.c, a.r, a.s}),
                y = product(op, {a.n, a.k, a.oh, a.ow});
  if (k == OpKind::Conv2dForward) return {{x, w}, {y}};
  if (k == OpKind::Conv2dBackwardData) return {{y, w}, {x}};
  return {{x, y}, {w}};
}

void conv_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::Conv2dBackwardData, n.attrs, {g.dy(), n.in[1]});
  if (g.needs_grad(n.in[1])) g.emit_grad(n.in[1], OpKind::Conv2dBackwardFilter, n.attrs, {n.in[0], g.dy()});
}

void conv2d_ref(OpKind kind, const ConvAttrs& a, In in, Out out) {
  // x: (n, c, h, w), w: (k, c, r, s), y: (n, k, oh, ow)
  auto xi = [&](int64_t n, int64_t c, int64_t y, int64_t x) { return ((n * a.c + c) * a.h + y) * a.w + x; };
  auto wi = [&](int64_t k, int64_t c, int64_t r, int64_t s) { return ((k * a.c + c) * a.r + r) * a.s + s; };
  auto yi = [&](int64_t n, int64_t k, int64_t y, int64_t x) { return ((n * a.k + k) * a.oh + y) * a.ow + x; };
  // Calls f(n, k, oy, ox, c, r, s, iy, ix) for every in-image tap of the convolution.
  auto each_tap = [&](auto&& f) {
    for (int64_t n = 0; n < a.n; ++n)
      for (int64_t k = 0; k < a.k; ++k)
        for (int64_t oy = 0; oy < a.oh; ++oy)
          for (int64_t ox = 0; ox < a.ow; ++ox)
            for (int64_t c = 0; c < a.c; ++c)
              for (int64_t r = 0; r < a.r; ++r)
                for (int64_t s = 0; s < a.s; ++s) {
                  const int64_t iy = oy * a.stride_h - a.pad_h + r, ix = ox * a.stride_w - a.pad_w + s;
                  if (iy >= 0 && iy < a.h && ix >= 0 && ix < a.w) f(n, k, oy, ox, c, r, s, iy, ix);
                }
  };
  if (kind == OpKind::Conv2dForward) {
    const float* x = in[0];
    const float* w = in[1];
    std::vector<double> acc(static_cast<size_t>(a.n * a.k * a.oh * a.ow), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[yi(n, k, oy, ox)] += double(x[xi(n, c, iy, ix)]) * w[wi(k, c, r, s)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  } else if (kind == OpKind::Conv2dBackwardData) {
    const float* dy = in[0];
    const float* w = in[1];
    std::vector<double> acc(static_cast<size_t>(a.n * a.c * a.h * a.w), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[xi(n, c, iy, ix)] += double(dy[yi(n, k, oy, ox)]) * w[wi(k, c, r, s)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  } else {
    const float* x = in[0];
    const float* dy = in[1];
    std::vector<double> acc(static_cast<size_t>(a.k * a.c * a.r * a.s), 0.0);
    each_tap([&](auto n, auto k, auto oy, auto ox, auto c, auto r, auto s, auto iy, auto ix) {
      acc[wi(k, c, r, s)] += double(x[xi(n, c, iy, ix)]) * dy[yi(n, k, oy, ox)];
    });
    std::copy(acc.begin(), acc.end(), out[0]);
  }
}

void conv_cases(Table& t) {
  const Gen f = uni(-1.f, 1.f);
  t.grad("2x3x6x5.k4.r3x2.s2x1.p1x0", OpKind::Conv2dForward, ConvAttrs{2, 3, 6, 5, 4, 3, 2, 2, 1, 1, 0, 3, 4}, {f, f},
         {kOut}, Check::reduction);

  struct C {
    const char* name;
    int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
    bool floats;
    bool large;
  };
  const C cfgs[] = {
      {"1x1x1x1.k1.r1", 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, false, false},
      {"2x3x7x5.k4.r3.p1", 2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1, true, false},
      {"2x5x9x11.k6.r3.s2.p1", 2, 5, 9, 11, 6, 3, 3, 2, 2, 1, 1, true, false},
      {"1x2x8x8.k3.r5.p2", 1, 2, 8, 8, 3, 5, 5, 1, 1, 2, 2, false, false},
      {"2x67x6x6.k65.r1", 2, 67, 6, 6, 65, 1, 1, 1, 1, 0, 0, true, false},
      {"3x4x10x7.k5.r2.s3", 3, 4, 10, 7, 5, 2, 2, 3, 3, 0, 0, false, false},
      {"2x3x5x6.k2.r3x2.s1x2.p2x0", 2, 3, 5, 6, 2, 3, 2, 1, 2, 2, 0, false, false},
      {"1x3x13x13.k8.r3.valid", 1, 3, 13, 13, 8, 3, 3, 1, 1, 0, 0, false, false},
      {"8x16x14x14.k32.r5.p2", 8, 16, 14, 14, 32, 5, 5, 1, 1, 2, 2, true, false},
      {"16x8x16x16.k16.r3.p1", 16, 8, 16, 16, 16, 3, 3, 1, 1, 1, 1, true, false},
      {"16x1x28x28.k32.r3.p1", 16, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, false},  // the CNN sample's layers
      {"16x32x14x14.k64.r3.p1", 16, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, true, false},
      {"16x16x28x28.k32.r3.p1", 16, 16, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, true},
      {"2x3x8x8.k4.r1.s2", 2, 3, 8, 8, 4, 1, 1, 2, 2, 0, 0, true, false},  // strided pointwise
      {"1x4x9x7.k3.r2x4.s3x1.p0x3", 1, 4, 9, 7, 3, 2, 4, 3, 1, 0, 3, true, false},
      {"7x3x3x3.k2.r3.valid", 7, 3, 3, 3, 2, 3, 3, 1, 1, 0, 0, true, false},  // one output pixel
  };
  const OpKind kinds[] = {OpKind::Conv2dForward, OpKind::Conv2dBackwardData, OpKind::Conv2dBackwardFilter};
  for (const C& c : cfgs) {
    ConvAttrs a;
    a.n = c.n, a.c = c.c, a.h = c.h, a.w = c.w, a.k = c.k, a.r = c.r, a.s = c.s;
    a.stride_h = c.sh, a.stride_w = c.sw, a.pad_h = c.ph, a.pad_w = c.pw;
    a.oh = (c.h + 2 * c.ph - c.r) / c.sh + 1;
    a.ow = (c.w + 2 * c.pw - c.s) / c.sw + 1;
    for (OpKind k : kinds) {
      t.add(std::string(c.name) + ".int", k, a, {kI, kI}, {kOut}, Check::reduction, true).large = c.large;
      if (c.floats)
        t.add(std::string(c.name) + ".float", k, a, {kF, kF}, {kOut}, Check::reduction, false).large = c.large;
    }
  }

  // Long loops (op_support.hpp): the implicit GEMM's reduction is c*r*s forward, k*r*s backward-data, n*oh*ow for
  // the filter.
  struct L {
    const char* name;
    int64_t n, c, h, w, k, r, s, pad;
    bool large;
  };
  const L convs[] = {{"1x3400x3x3.k3.r3.p1", 1, 3400, 3, 3, 3, 3, 3, 1, false},   // c*r*s = 30600
                     {"1x60000x3x3.k2.r3.p1", 1, 60000, 3, 3, 2, 3, 3, 1, true},  // c*r*s = 540000
                     {"1x2x3x3.k60000.r3.p1", 1, 2, 3, 3, 60000, 3, 3, 1, true},  // k*r*s = 540000
                     {"2x1x180x180.k3.r1", 2, 1, 180, 180, 3, 1, 1, 0, false},    // n*oh*ow = 64800
                     {"2x1x600x600.k1.r1", 2, 1, 600, 600, 1, 1, 1, 0, true}};    // n*oh*ow = 720000
  for (const L& c : convs) {
    ConvAttrs a;
    a.n = c.n, a.c = c.c, a.h = c.h, a.w = c.w, a.k = c.k, a.r = c.r, a.s = c.s, a.pad_h = c.pad, a.pad_w = c.pad;
    a.oh = c.h + 2 * c.pad - c.r + 1;
    a.ow = c.w + 2 * c.pad - c.s + 1;
    for (OpKind k : kinds)
      t.add(std::string(c.name) + ".int", k, a, {kI, kI}, {kOut}, Check::reduction, true).large = c.large;
  }
}

// ---- the layer ---------------------------------------------------------------------------------------------

class Conv2dLayer : public Layer {
 public:
  explicit Conv2dLayer(const ConfigNode& c)
      : filters_(c.get_int("filters")),
        kernel_(c.get_pair("kernel", {3, 3})),
        strides_(c.get_pair("strides", {1, 1})),
        same_(c.get_choice("padding", {"same", "valid"}, "valid") == "same"),
        use_bias_(c.get_bool("use_bias", true)),
        act_(read_activation(c, "activation", "linear")),
        where_(c.where("filters")) {
    if (filters_ <= 0) c.fail("filters", "expected a positive integer");
    if (!Shape{filters_}.fits())
      c.fail("filters", "is " + std::to_string(filters_) + ", more than one tensor can hold (2^46 float32 values)");
    if (kernel_.first <= 0 || kernel_.second <= 0) c.fail("kernel", "expected positive sizes");
    if (strides_.first <= 0 || strides_.second <= 0) c.fail("strides", "expected positive strides");
    c.finish();
  }
  std::string type() const override { return "conv2d"; }
  // x: (N, C, H, W) -> y: (N, filters, OH, OW)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4) shape_error(g, "conv2d expects input (batch, channels, height, width), got " + s.str());
    ConvAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.k = filters_, a.r = kernel_.first, a.s = kernel_.second;
    a.stride_h = strides_.first, a.stride_w = strides_.second;
    check_size(g, {a.k, a.c, a.r, a.s}, "kernel (filters, channels, kernel height, kernel width)",
               where_ + " or 'kernel'");
    window_geometry(same_, a.h, a.r, a.stride_h, a.oh, a.pad_h);
    window_geometry(same_, a.w, a.s, a.stride_w, a.ow, a.pad_w);
    if (a.oh <= 0 || a.ow <= 0 || a.pad_h < 0 || a.pad_w < 0)
      shape_error(g, "kernel " + std::to_string(a.r) + "x" + std::to_string(a.s) + " with padding \"" +
                         (same_ ? "same" : "valid") + "\" does not fit input " + s.str());
    check_size(g, {a.n, a.k, a.oh, a.ow}, "output (batch, filters, height, width)", where_);
    int64_t fan_in = a.c * a.r * a.s, fan_out = a.k * a.r * a.s;
    TensorId w = g.param("kernel", {a.k, a.c, a.r, a.s}, Init{InitKind::glorot_uniform, fan_in, fan_out});
    Shape ys{a.n, a.k, a.oh, a.ow};
    TensorId y = g.op1(OpKind::Conv2dForward, a, {in[0], w}, ys);
    if (use_bias_) {
      TensorId b = g.param("bias", {a.k}, Init{});
      y = g.op1(OpKind::BiasAdd, BiasAttrs{a.n, a.k, a.oh * a.ow}, {y, b}, ys);
    }
    return act_ ? apply_activation(g, y, *act_) : y;
  }

 private:
  int64_t filters_;
  std::pair<int64_t, int64_t> kernel_, strides_;
  bool same_, use_bias_;
  std::optional<std::string> act_;
  std::string where_;  // the `filters` key, for size errors at build time
};

// ONNX: Conv, padded at the end as far as Kiln's output size reaches (a bias add may fold into it).
void conv_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<ConvAttrs>(n.attrs);
  const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.r - a.h - a.pad_h);
  const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.s - a.w - a.pad_w);
  e.add(OnnxNode{"Conv", {e.in(g, n, 0), e.in(g, n, 1)}, {e.out(g, n, 0)}, {}}
            .ints("kernel_shape", {a.r, a.s})
            .ints("strides", {a.stride_h, a.stride_w})
            .ints("pads", {a.pad_h, a.pad_w, pb, pr}));
  e.mark_foldable(n.out[0]);
}

}  // namespace

KILN_CORE_OPS(conv) {
  for (auto [k, name] : {std::pair{OpKind::Conv2dForward, "conv2d_forward"},
                         std::pair{OpKind::Conv2dBackwardData, "conv2d_backward_data"},
                         std::pair{OpKind::Conv2dBackwardFilter, "conv2d_backward_filter"}}) {
    OpDesc d = desc<ConvAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return conv_arity(k, name, a); },
        ref_of<ConvAttrs, conv2d_ref>(k));
    if (k == OpKind::Conv2dForward) d.grad = conv_grad;
    d.low_precision = {0, 1};
    d.cases = cases_of(k, conv_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("conv2d", factory<Conv2dLayer>());
  register_onnx_mapping(OpKind::Conv2dForward, conv_onnx);
}

}  // namespace kiln::op_impl
