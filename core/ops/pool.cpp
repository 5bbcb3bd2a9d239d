// 2-D max and average pooling (NCHW), forward and backward. Semantics: ops.hpp.
// Also the max_pool2d, avg_pool2d and global_avg_pool2d layers that emit them.
#include <algorithm>

#include "kiln/onnx_export.hpp"
#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

OpArity pool_arity(OpKind k, std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<PoolAttrs>(op, attrs);
  check_dims(op, {{"n", a.n},
                  {"c", a.c},
                  {"h", a.h},
                  {"w", a.w},
                  {"kh", a.kh},
                  {"kw", a.kw},
                  {"pad_h", a.pad_h},
                  {"pad_w", a.pad_w},
                  {"oh", a.oh},
                  {"ow", a.ow}});
  check_strides(op, a.stride_h, a.stride_w);
  const int64_t x = product(op, {a.n, a.c, a.h, a.w}), y = product(op, {a.n, a.c, a.oh, a.ow});
  if (k == OpKind::MaxPoolForward || k == OpKind::AvgPoolForward) return {{x}, {y}};
  if (k == OpKind::MaxPoolBackward) return {{x, y, y}, {x}};
  return {{y}, {x}};
}

void max_pool_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::MaxPoolBackward, n.attrs, {n.in[0], n.out[0], g.dy()});
}

void avg_pool_grad(GradContext& g) {
  const Node& n = g.node();
  if (g.needs_grad(n.in[0])) g.emit_grad(n.in[0], OpKind::AvgPoolBackward, n.attrs, {g.dy()});
}

void pool_ref(OpKind kind, const PoolAttrs& a, In in, Out out) {
  const bool forward = kind == OpKind::MaxPoolForward || kind == OpKind::AvgPoolForward;
  float* dst = out[0];
  if (!forward) std::fill(dst, dst + a.n * a.c * a.h * a.w, 0.0f);
  for (int64_t p = 0; p < a.n * a.c; ++p) {  // one (n, c) plane at a time
    const int64_t xoff = p * a.h * a.w, yoff = p * a.oh * a.ow;
    for (int64_t oy = 0; oy < a.oh; ++oy)
      for (int64_t ox = 0; ox < a.ow; ++ox) {
        const int64_t y0 = std::max<int64_t>(oy * a.stride_h - a.pad_h, 0);
        const int64_t y1 = std::min<int64_t>(oy * a.stride_h - a.pad_h + a.kh, a.h);
        const int64_t x0 = std::max<int64_t>(ox * a.stride_w - a.pad_w, 0);
        const int64_t x1 = std::min<int64_t>(ox * a.stride_w - a.pad_w + a.kw, a.w);
        const int64_t o = yoff + oy * a.ow + ox;
        const int64_t count = std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0);
        if (kind == OpKind::MaxPoolForward) {
          float best = 0.0f;
          bool found = false;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) {
              const float v = in[0][xoff + iy * a.w + ix];
              if (!found || v > best) best = v;
              found = true;
            }
          dst[o] = best;
        } else if (kind == OpKind::MaxPoolBackward) {
          const float* x = in[0];
          const float yv = in[1][o];
          bool done = false;
          for (int64_t iy = y0; iy < y1 && !done; ++iy)
            for (int64_t ix = x0; ix < x1 && !done; ++ix)
              if (x[xoff + iy * a.w + ix] == yv) {
                dst[xoff + iy * a.w + ix] += in[2][o];
                done = true;
              }
        } else if (kind == OpKind::AvgPoolForward) {
          double acc = 0;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) acc += in[0][xoff + iy * a.w + ix];
          dst[o] = count > 0 ? static_cast<float>(acc / double(count)) : 0.0f;
        } else if (count > 0) {
          const float g = static_cast<float>(double(in[0][o]) / double(count));
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) dst[xoff + iy * a.w + ix] += g;
        }
      }
  }
}

void pool_cases(Table& t) {
  // spread() inputs keep finite differences clear of max-pool ties.
  t.grad("2x2x5x5.k3.s2.p1", OpKind::MaxPoolForward, PoolAttrs{2, 2, 5, 5, 3, 3, 2, 2, 1, 1, 3, 3}, {spread(-1.f, 1.f)},
         {kOut}, Check::elementwise);
  t.grad("2x2x5x5.k3.s2.p1", OpKind::AvgPoolForward, PoolAttrs{2, 2, 5, 5, 3, 3, 2, 2, 1, 1, 3, 3}, {uni(-1.f, 1.f)},
         {kOut}, Check::elementwise);

  struct P {
    const char* name;
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
    bool large;
  };
  const P cfgs[] = {
      {"1x1x1x1.k1", 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, false},
      {"2x3x8x8.k2.s2", 2, 3, 8, 8, 2, 2, 2, 2, 0, 0, false},
      {"2x3x7x9.k3.s2.p1", 2, 3, 7, 9, 3, 3, 2, 2, 1, 1, false},
      {"1x2x5x5.k3.s1.p1", 1, 2, 5, 5, 3, 3, 1, 1, 1, 1, false},
      {"1x1x3x3.k2.p2.empty_windows", 1, 1, 3, 3, 2, 2, 1, 1, 2, 2, false},
      {"4x5x13x11.k3x2.s3x2.p0x1", 4, 5, 13, 11, 3, 2, 3, 2, 0, 1, false},
      {"16x32x32x32.k2.s2", 16, 32, 32, 32, 2, 2, 2, 2, 0, 0, true},
      {"2x3x17x37.k2.s2.odd", 2, 3, 17, 37, 2, 2, 2, 2, 0, 0, false},  // 18 windows a row: 8 + 8 + 2, odd edges
      {"3x4x14x14.k2.s2", 3, 4, 14, 14, 2, 2, 2, 2, 0, 0, false},      // 7 windows a row, the last row masked
      {"2x3x5x27.k2.s2.odd", 2, 3, 5, 27, 2, 2, 2, 2, 0, 0, false},    // 13 a row: 8, then the last 8 again, odd edges
      {"2x3x6x28.k2.s2", 2, 3, 6, 28, 2, 2, 2, 2, 0, 0, false},        // 14 a row (the CNN sample's 28x28)
  };
  for (const P& p : cfgs) {
    PoolAttrs a;
    a.n = p.n, a.c = p.c, a.h = p.h, a.w = p.w, a.kh = p.kh, a.kw = p.kw;
    a.stride_h = p.sh, a.stride_w = p.sw, a.pad_h = p.ph, a.pad_w = p.pw;
    a.oh = (p.h + 2 * p.ph - p.kh) / p.sh + 1;
    a.ow = (p.w + 2 * p.pw - p.kw) / p.sw + 1;
    const std::string base = p.name;
    // Small integers make ties common: max_pool_backward must pick the first maximum of each window.
    t.add(base + ".int", OpKind::MaxPoolForward, a, {kI}, {kOut}, Check::elementwise, true).large = p.large;
    t.add(base + ".int", OpKind::MaxPoolBackward, a, {kI, {Gen::max_pool_y}, kI}, {kOut}, Check::elementwise, true)
        .large = p.large;
    t.add(base + ".float", OpKind::MaxPoolBackward, a, {kF, {Gen::max_pool_y}, kF}, {kOut}, Check::elementwise, false)
        .large = p.large;
    // Averages divide by the window's valid count: correctly rounded, so still compared elementwise.
    t.add(base + ".int", OpKind::AvgPoolForward, a, {kI}, {kOut}, Check::elementwise, false).large = p.large;
    t.add(base + ".int", OpKind::AvgPoolBackward, a, {kI}, {kOut}, Check::elementwise, false).large = p.large;
  }

  // Long loops (op_support.hpp): a 150x150 window walks 22650 iterations per output; 256x256 (global pooling of a
  // 256x256 image) 65792.
  for (int64_t k : {150, 256}) {
    PoolAttrs a;
    a.n = 1, a.c = 2, a.h = k, a.w = k, a.kh = k, a.kw = k, a.stride_h = k, a.stride_w = k, a.oh = 1, a.ow = 1;
    const std::string v = "1x2x" + str(k) + "x" + str(k) + ".k" + str(k) + ".global.int";
    t.add(v, OpKind::MaxPoolForward, a, {kI}, {kOut}, Check::elementwise, true);
    t.add(v, OpKind::MaxPoolBackward, a, {kI, {Gen::max_pool_y}, kI}, {kOut}, Check::elementwise, true);
    t.add(v, OpKind::AvgPoolForward, a, {kI}, {kOut}, Check::elementwise, false);
    t.add(v, OpKind::AvgPoolBackward, a, {kI}, {kOut}, Check::elementwise, false);
  }
}

// ---- the layers --------------------------------------------------------------------------------------------

class Pool2dLayer : public Layer {
 public:
  Pool2dLayer(const ConfigNode& c, bool max)
      : max_(max),
        pool_(c.get_pair("pool", {2, 2})),
        strides_(c.get_pair("strides", pool_)),
        same_(c.get_choice("padding", {"same", "valid"}, "valid") == "same") {
    if (pool_.first <= 0 || pool_.second <= 0) c.fail("pool", "expected positive sizes");
    if (strides_.first <= 0 || strides_.second <= 0) c.fail("strides", "expected positive strides");
    c.finish();
  }
  std::string type() const override { return max_ ? "max_pool2d" : "avg_pool2d"; }
  // x: (N, C, H, W) -> y: (N, C, OH, OW)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4) shape_error(g, type() + " expects input (batch, channels, height, width), got " + s.str());
    PoolAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.kh = pool_.first, a.kw = pool_.second, a.stride_h = strides_.first, a.stride_w = strides_.second;
    window_geometry(same_, a.h, a.kh, a.stride_h, a.oh, a.pad_h);
    window_geometry(same_, a.w, a.kw, a.stride_w, a.ow, a.pad_w);
    if (a.oh <= 0 || a.ow <= 0 || a.pad_h < 0 || a.pad_w < 0)
      shape_error(g, "pool window does not fit input " + s.str());
    return g.op1(max_ ? OpKind::MaxPoolForward : OpKind::AvgPoolForward, a, {in[0]}, {a.n, a.c, a.oh, a.ow});
  }

 private:
  bool max_;
  std::pair<int64_t, int64_t> pool_, strides_;
  bool same_;
};

// (N, C, H, W) -> (N, C): the mean of each channel's plane (Keras' GlobalAveragePooling2D, PyTorch's
// AdaptiveAvgPool2d(1) + flatten).
class GlobalAvgPoolLayer : public Layer {
 public:
  explicit GlobalAvgPoolLayer(const ConfigNode& c) { c.finish(); }
  std::string type() const override { return "global_avg_pool2d"; }
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape& s = g.shape(in[0]);
    if (s.rank() != 4)
      shape_error(g, "global_avg_pool2d expects input (batch, channels, height, width), got " + s.str());
    PoolAttrs a;
    a.n = s[0], a.c = s[1], a.h = s[2], a.w = s[3];
    a.kh = a.h, a.kw = a.w, a.stride_h = std::max<int64_t>(a.h, 1), a.stride_w = std::max<int64_t>(a.w, 1);
    a.oh = 1, a.ow = 1;
    TensorId y = g.op1(OpKind::AvgPoolForward, a, {in[0]}, {a.n, a.c, 1, 1});
    return g.reshape(y, {a.n, a.c});
  }
};

// ONNX: MaxPool or AveragePool, padded at the end as far as Kiln's output size reaches.
void pool_onnx(OnnxEmitter& e, const Graph& g, const Node& n) {
  const auto& a = std::get<PoolAttrs>(n.attrs);
  const int64_t pb = std::max<int64_t>(0, (a.oh - 1) * a.stride_h + a.kh - a.h - a.pad_h);
  const int64_t pr = std::max<int64_t>(0, (a.ow - 1) * a.stride_w + a.kw - a.w - a.pad_w);
  const bool mx = n.kind == OpKind::MaxPoolForward;
  OnnxNode x{mx ? "MaxPool" : "AveragePool", {e.in(g, n, 0)}, {e.out(g, n, 0)}, {}};
  x.ints("kernel_shape", {a.kh, a.kw})
      .ints("strides", {a.stride_h, a.stride_w})
      .ints("pads", {a.pad_h, a.pad_w, pb, pr});
  if (!mx) x.i("count_include_pad", 0);  // Kiln averages over the valid elements
  e.add(std::move(x));
}

}  // namespace

KILN_CORE_OPS(pool) {
  for (auto [k, name] :
       {std::pair{OpKind::MaxPoolForward, "max_pool_forward"}, std::pair{OpKind::MaxPoolBackward, "max_pool_backward"},
        std::pair{OpKind::AvgPoolForward, "avg_pool_forward"},
        std::pair{OpKind::AvgPoolBackward, "avg_pool_backward"}}) {
    OpDesc d = desc<PoolAttrs>(
        name, [k = k, name = name](const OpAttrs& a) { return pool_arity(k, name, a); },
        ref_of<PoolAttrs, pool_ref>(k));
    if (k == OpKind::MaxPoolForward) d.grad = max_pool_grad;
    if (k == OpKind::AvgPoolForward) d.grad = avg_pool_grad;
    d.cases = cases_of(k, pool_cases);
    register_op(k, std::move(d));
  }
  add_core_layer("max_pool2d",
                 [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, true); });
  add_core_layer("avg_pool2d",
                 [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<Pool2dLayer>(c, false); });
  add_core_layer("global_avg_pool2d", factory<GlobalAvgPoolLayer>());
  register_onnx_mapping(OpKind::MaxPoolForward, pool_onnx);
  register_onnx_mapping(OpKind::AvgPoolForward, pool_onnx);
}

}  // namespace kiln::op_impl
