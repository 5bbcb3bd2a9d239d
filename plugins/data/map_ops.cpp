#include "map_ops.hpp"

#include <algorithm>
#include <cmath>

namespace kiln::data {
namespace {

class ScaleOp final : public MapOp {
 public:
  explicit ScaleOp(float f) : f_(f) {}
  std::string name() const override { return "scale"; }
  void apply(Element& e, CounterRng& rng) const override { apply_row(e.x.data.data(), e.y.data.data(), rng); }
  bool in_place() const override { return true; }
  void apply_row(float* x, float*, CounterRng&) const override {
    const auto n = static_cast<size_t>(x_out.numel());
    for (size_t i = 0; i < n; ++i) x[i] *= f_;
  }
  std::optional<float> pure_scale() const override { return f_; }

 private:
  float f_;
};

// (x - mean[c]) / std[c] with c the index along the first dim (the channel for (C, H, W) images).
class NormalizeOp final : public MapOp {
 public:
  NormalizeOp(std::vector<float> mean, std::vector<float> inv_std)
      : mean_(std::move(mean)), inv_std_(std::move(inv_std)) {}
  std::string name() const override { return "normalize"; }
  void apply(Element& e, CounterRng& rng) const override { apply_row(e.x.data.data(), e.y.data.data(), rng); }
  bool in_place() const override { return true; }
  void apply_row(float* x, float*, CounterRng&) const override {
    const size_t c = x_out.rank() ? static_cast<size_t>(x_out[0]) : 1;
    const size_t inner = static_cast<size_t>(x_out.numel()) / c;
    for (size_t k = 0; k < c; ++k) {
      const float m = mean_.size() == 1 ? mean_[0] : mean_[k];
      const float s = inv_std_.size() == 1 ? inv_std_[0] : inv_std_[k];
      float* p = x + k * inner;
      for (size_t i = 0; i < inner; ++i) p[i] = (p[i] - m) * s;
    }
  }

 private:
  std::vector<float> mean_, inv_std_;
};

// Per-example zero mean, unit variance; the deviation is floored at 1/sqrt(n) so a constant example stays finite.
class StandardizeOp final : public MapOp {
 public:
  std::string name() const override { return "standardize"; }
  void apply(Element& e, CounterRng& rng) const override { apply_row(e.x.data.data(), e.y.data.data(), rng); }
  bool in_place() const override { return true; }
  void apply_row(float* x, float*, CounterRng&) const override {
    const auto count = static_cast<size_t>(x_out.numel());
    const auto n = static_cast<double>(count);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < count; ++i) sum += x[i];
    const double mean = sum / n;
    for (size_t i = 0; i < count; ++i) sq += (x[i] - mean) * (x[i] - mean);
    const double sd = std::max(std::sqrt(sq / n), 1.0 / std::sqrt(n));
    const auto m = static_cast<float>(mean), inv = static_cast<float>(1.0 / sd);
    for (size_t i = 0; i < count; ++i) x[i] = (x[i] - m) * inv;
  }
};

class OneHotOp final : public MapOp {
 public:
  explicit OneHotOp(int64_t classes) : classes_(classes) {}
  std::string name() const override { return "one_hot"; }
  void apply(Element& e, CounterRng&) const override {
    const float v = e.y.data.at(0);
    const auto k = static_cast<int64_t>(v);
    if (static_cast<float>(k) != v || k < 0 || k >= classes_)
      throw DataError("map op one_hot: label " + std::to_string(v) + " is not a class index in 0.." +
                      std::to_string(classes_ - 1) + " (set classes = to the number of classes)");
    e.y = HostTensor(Shape{classes_}, 0.f);
    e.y.data[static_cast<size_t>(k)] = 1.f;
  }

 private:
  int64_t classes_;
};

// x: (C, H, W) -> (C, h, w): zero-pad by `padding` on every side, then take an h x w window at a random offset.
class RandomCropOp final : public MapOp {
 public:
  RandomCropOp(int64_t h, int64_t w, int64_t pad) : h_(h), w_(w), pad_(pad) {}
  std::string name() const override { return "random_crop"; }
  void apply(Element& e, CounterRng& rng) const override {
    const int64_t c = e.x.shape[0], hin = e.x.shape[1], win = e.x.shape[2];
    const auto oy = static_cast<int64_t>(rng.below(static_cast<uint64_t>(hin + 2 * pad_ - h_ + 1))) - pad_;
    const auto ox = static_cast<int64_t>(rng.below(static_cast<uint64_t>(win + 2 * pad_ - w_ + 1))) - pad_;
    HostTensor out(Shape{c, h_, w_}, 0.f);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h_; ++y) {
        const int64_t sy = y + oy;
        if (sy < 0 || sy >= hin) continue;
        for (int64_t x = 0; x < w_; ++x) {
          const int64_t sx = x + ox;
          if (sx < 0 || sx >= win) continue;
          out.data[static_cast<size_t>((ch * h_ + y) * w_ + x)] =
              e.x.data[static_cast<size_t>((ch * hin + sy) * win + sx)];
        }
      }
    e.x = std::move(out);
  }

 private:
  int64_t h_, w_, pad_;
};

// x: (C, H, W) -> (C, h, w): the h x w window at the centre (offset (H - h) / 2, (W - w) / 2, rounded down, as
// tf.image.central_crop and Keras' CenterCrop / RandomCrop at inference do).
class CenterCropOp final : public MapOp {
 public:
  CenterCropOp(int64_t h, int64_t w) : h_(h), w_(w) {}
  std::string name() const override { return "center_crop"; }
  void apply(Element& e, CounterRng&) const override {
    const int64_t c = e.x.shape[0], hin = e.x.shape[1], win = e.x.shape[2];
    const int64_t oy = (hin - h_) / 2, ox = (win - w_) / 2;
    HostTensor out(Shape{c, h_, w_}, 0.f);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h_; ++y)
        std::copy_n(e.x.data.begin() + static_cast<std::ptrdiff_t>((ch * hin + y + oy) * win + ox), w_,
                    out.data.begin() + static_cast<std::ptrdiff_t>((ch * h_ + y) * w_));
    e.x = std::move(out);
  }

 private:
  int64_t h_, w_;
};

// Mirrors the last dim (width) with probability p.
class FlipHorizontalOp final : public MapOp {
 public:
  explicit FlipHorizontalOp(double p) : p_(p) {}
  std::string name() const override { return "flip_horizontal"; }
  void apply(Element& e, CounterRng& rng) const override { apply_row(e.x.data.data(), e.y.data.data(), rng); }
  bool in_place() const override { return true; }
  void apply_row(float* x, float*, CounterRng& rng) const override {
    if (rng.uniform() >= p_) return;
    const auto w = static_cast<size_t>(x_out[x_out.rank() - 1]);
    const auto n = static_cast<size_t>(x_out.numel());
    for (size_t row = 0; row < n; row += w) std::reverse(x + row, x + row + w);
  }

 private:
  double p_;
};

std::vector<float> channel_values(const ConfigNode& cfg, const std::string& key, int64_t channels, bool positive) {
  std::vector<double> v = cfg.get_float_list(key);
  if (v.size() != 1 && static_cast<int64_t>(v.size()) != channels)
    cfg.fail(key,
             "needs 1 value or one per channel (" + std::to_string(channels) + "), got " + std::to_string(v.size()));
  std::vector<float> out;
  for (double d : v) {
    if (!std::isfinite(d) || (positive && d <= 0))
      cfg.fail(key, std::string("values must be finite") + (positive ? " and > 0" : "") + ", got " + std::to_string(d));
    out.push_back(static_cast<float>(positive ? 1.0 / d : d));
  }
  return out;
}

}  // namespace

std::unique_ptr<MapOp> make_scale_op(double factor, const Shape& x, const Shape& y) {
  auto op = std::make_unique<ScaleOp>(static_cast<float>(factor));
  op->x_out = x;
  op->y_out = y;
  return op;
}

std::unique_ptr<MapOp> make_map_op(const ConfigNode& cfg, const Shape& x, const Shape& y, const std::string& pipeline) {
  const std::vector<std::string> kinds = {"scale",       "normalize",   "standardize",    "one_hot",
                                          "center_crop", "random_crop", "flip_horizontal"};
  if (!cfg.has("op"))
    cfg.fail("op",
             "is missing: every map op needs op = one of scale, normalize, standardize, one_hot, center_crop, "
             "random_crop, flip_horizontal");
  std::string kind = cfg.get_choice("op", kinds, "scale");
  // Random augmentation is for training: evaluating on randomly cropped or flipped examples makes the test metrics
  // noisy and different from what the model sees in use. Keras' RandomCrop centre-crops and RandomFlip does
  // nothing at inference; Kiln asks for that to be written instead of changing the op behind the config's back.
  if (pipeline == "test" && kind == "random_crop") {
    auto [h, w] = cfg.get_pair("size", {x.rank() == 3 ? x[1] : 0, x.rank() == 3 ? x[2] : 0});
    const bool same = x.rank() == 3 && h == x[1] && w == x[2];
    cfg.fail("op",
             "random_crop is a training augmentation and [data.test] is for evaluation: " +
                 (same ? std::string("its crop is the image's own size, so remove the op here (the centre crop of the "
                                     "padded image is the image itself)")
                       : "use op = \"center_crop\", size = [" + std::to_string(h) + ", " + std::to_string(w) +
                             "] here (what Keras' RandomCrop does at inference)") +
                 "; keep random_crop in [data.train]");
  }
  if (pipeline == "test" && kind == "flip_horizontal")
    cfg.fail("op",
             "flip_horizontal is a training augmentation and [data.test] is for evaluation: remove the op here "
             "(Keras' RandomFlip does nothing at inference); keep it in [data.train]");
  std::unique_ptr<MapOp> op;
  Shape xo = x, yo = y;
  if (kind == "scale") {
    op = make_scale_op(cfg.get_float("factor"), x, y);
  } else if (kind == "normalize") {
    const int64_t c = x.rank() ? x[0] : 1;
    auto mean = channel_values(cfg, "mean", c, false);
    auto inv_std = channel_values(cfg, "std", c, true);
    op = std::make_unique<NormalizeOp>(std::move(mean), std::move(inv_std));
  } else if (kind == "standardize") {
    op = std::make_unique<StandardizeOp>();
  } else if (kind == "one_hot") {
    int64_t classes = cfg.get_int("classes");
    if (classes < 2) cfg.fail("classes", "must be >= 2, got " + std::to_string(classes));
    if (y.rank() != 0)
      cfg.fail("op",
               "one_hot needs a scalar class-index label, but labels here have shape " + y.str() + " (one_hot twice?)");
    op = std::make_unique<OneHotOp>(classes);
    yo = Shape{classes};
  } else if (kind == "center_crop") {
    if (x.rank() != 3) cfg.fail("op", "center_crop needs (C, H, W) examples, got shape " + x.str());
    if (!cfg.has("size"))
      cfg.fail("size", "is missing: center_crop needs size = [height, width] (or one int for a square)");
    auto [h, w] = cfg.get_pair("size", {0, 0});
    if (h < 1 || w < 1 || h > x[1] || w > x[2])
      cfg.fail("size", "crop " + std::to_string(h) + " x " + std::to_string(w) + " does not fit in the " +
                           std::to_string(x[1]) + " x " + std::to_string(x[2]) + " image (expected 1.." +
                           std::to_string(x[1]) + " x 1.." + std::to_string(x[2]) + ")");
    op = std::make_unique<CenterCropOp>(h, w);
    xo = Shape{x[0], h, w};
  } else if (kind == "random_crop") {
    auto [h, w] = cfg.get_pair("size", {x.rank() == 3 ? x[1] : 0, x.rank() == 3 ? x[2] : 0});
    int64_t pad = cfg.get_int("padding", 0);
    if (x.rank() != 3) cfg.fail("op", "random_crop needs (C, H, W) examples, got shape " + x.str());
    if (pad < 0) cfg.fail("padding", "must be >= 0, got " + std::to_string(pad));
    if (h < 1 || w < 1 || h > x[1] + 2 * pad || w > x[2] + 2 * pad)
      cfg.fail("size", "crop " + std::to_string(h) + " x " + std::to_string(w) + " does not fit in the padded " +
                           std::to_string(x[1] + 2 * pad) + " x " + std::to_string(x[2] + 2 * pad) + " image");
    op = std::make_unique<RandomCropOp>(h, w, pad);
    xo = Shape{x[0], h, w};
  } else {  // flip_horizontal
    double p = cfg.get_float("probability", 0.5);
    if (!(p >= 0 && p <= 1)) cfg.fail("probability", "must be in [0, 1], got " + std::to_string(p));
    if (x.rank() < 2) cfg.fail("op", "flip_horizontal needs examples with a width dim (rank >= 2), got " + x.str());
    op = std::make_unique<FlipHorizontalOp>(p);
  }
  cfg.finish();
  op->x_out = xo;
  op->y_out = yo;
  return op;
}

}  // namespace kiln::data
