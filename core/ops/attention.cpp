// The `attention` layer: multi-head (causal) self-attention as nanoGPT's CausalSelfAttention computes it, built
// from ordinary ops so every backend runs it and the planner sees each T x T tensor as an activation.
// It has no op of its own: the ops it emits (gemm, bias_add, permute, split, batched_gemm, softmax, dropout) live in
// their families' files.
#include <cmath>
#include <memory>

#include "layer_support.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

class AttentionLayer : public Layer {
 public:
  explicit AttentionLayer(const ConfigNode& c)
      : heads_(c.get_int("heads")),
        causal_(c.get_bool("causal", true)),
        rate_(static_cast<float>(c.get_float("dropout", 0.0))),
        use_bias_(c.get_bool("use_bias", true)),
        init_std_(c.get_float("init_std", 0.0)),
        proj_init_std_(c.get_float("proj_init_std", init_std_)) {
    if (heads_ <= 0) c.fail("heads", "expected a positive number of heads, found " + std::to_string(heads_));
    if (!(rate_ >= 0.f && rate_ < 1.f)) c.fail("dropout", "expected a rate in [0, 1), found " + std::to_string(rate_));
    if (c.has("init_std") && (!(init_std_ > 0) || !std::isfinite(init_std_)))
      c.fail("init_std", "expected a positive, finite standard deviation such as 0.02 (nanoGPT's)");
    if (c.has("proj_init_std") && (!(proj_init_std_ > 0) || !std::isfinite(proj_init_std_)))
      c.fail("proj_init_std", "expected a positive, finite standard deviation, e.g. 0.02 / sqrt(2 * n_layer)");
    c.finish();
  }
  std::string type() const override { return "attention"; }

  // x: (B, T, C) -> (B, T, C). D = C / heads.
  //   qkv = x Wqkv (+ b)              (B, T, 3C), viewed (B, T, 3, H, D)
  //   q, k, v = split(permute(qkv))   (3, B, H, T, D) -> three (B*H, T, D)
  //   att = softmax(q k^T / sqrt(D))  (B*H, T, T), causal: j <= i
  //   att = dropout(att)              training only
  //   y = att v                       (B*H, T, D), permuted to (B, T, H, D) = (B, T, C)
  //   out = y Wproj (+ b)             (B, T, C)
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    if (s.rank() != 3)
      throw ConfigError("layer '" + g.layer() + "': attention expects input (batch, positions, features), got " +
                        s.str() + "; an embedding layer over token ids gives that shape");
    const int64_t B = s[0], T = s[1], C = s[2];
    if (C % heads_ != 0)
      throw ConfigError("layer '" + g.layer() + "': heads = " + std::to_string(heads_) + " must divide the width " +
                        std::to_string(C) + " of input " + s.str());
    const int64_t H = heads_, D = C / H, BH = B * H, N = B * T * C;
    if (!Shape{BH, T, T}.fits())
      throw ConfigError("layer '" + g.layer() + "': its attention scores would be " + std::to_string(BH) + " x " +
                        std::to_string(T) + " x " + std::to_string(T) + " float32 values, more than one tensor holds");

    // c_attn: (C, 3C), PyTorch's c_attn.weight transposed.
    const Init qkv_init = init_std_ > 0 ? Init{InitKind::normal, C, 3 * C, static_cast<float>(init_std_)}
                                        : Init{InitKind::glorot_uniform, C, 3 * C};
    TensorId wqkv = g.param("qkv_kernel", {C, 3 * C}, qkv_init);
    TensorId qkv = g.op1(OpKind::Gemm, GemmAttrs{B * T, 3 * C, C}, {in[0], wqkv}, {B, T, 3 * C});
    if (use_bias_)
      qkv = g.op1(OpKind::BiasAdd, BiasAttrs{B * T, 3 * C, 1}, {qkv, g.param("qkv_bias", {3 * C}, Init{})},
                  {B, T, 3 * C});

    PermuteAttrs heads;  // (B, T, 3, H, D) -> (3, B, H, T, D)
    heads.rank = 5, heads.dims = {B, T, 3, H, D}, heads.perm = {2, 0, 3, 1, 4};
    const TensorId qkvh = g.op1(OpKind::Permute, heads, {qkv}, {3, B, H, T, D});
    const std::vector<TensorId> parts =
        g.op(OpKind::Split, ConcatAttrs{1, 1, {N, N, N}}, {qkvh}, {{B, H, T, D}, {B, H, T, D}, {B, H, T, D}});

    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    TensorId att =
        g.op1(OpKind::BatchedGemm, GemmAttrs{T, T, D, false, true, scale, 0.f, BH}, {parts[0], parts[1]}, {B, H, T, T});
    att = g.op1(OpKind::SoftmaxForward, SoftmaxAttrs{BH * T, T, causal_}, {att}, {B, H, T, T});
    if (g.training() && rate_ > 0.f)
      att = g.op1(OpKind::DropoutForward, DropoutAttrs{BH * T * T, rate_, g.layer_seed(), 0}, {att}, {B, H, T, T});
    const TensorId yh =
        g.op1(OpKind::BatchedGemm, GemmAttrs{T, D, T, false, false, 1.f, 0.f, BH}, {att, parts[2]}, {B, H, T, D});

    PermuteAttrs merge;  // (B, H, T, D) -> (B, T, H, D), i.e. (B, T, C)
    merge.rank = 4, merge.dims = {B, H, T, D}, merge.perm = {0, 2, 1, 3};
    const TensorId y = g.op1(OpKind::Permute, merge, {yh}, {B, T, C});

    // c_proj: (C, C).
    const Init proj_init = proj_init_std_ > 0 ? Init{InitKind::normal, C, C, static_cast<float>(proj_init_std_)}
                                              : Init{InitKind::glorot_uniform, C, C};
    TensorId out =
        g.op1(OpKind::Gemm, GemmAttrs{B * T, C, C}, {y, g.param("proj_kernel", {C, C}, proj_init)}, {B, T, C});
    if (use_bias_)
      out = g.op1(OpKind::BiasAdd, BiasAttrs{B * T, C, 1}, {out, g.param("proj_bias", {C}, Init{})}, {B, T, C});
    return out;
  }

 private:
  int64_t heads_;
  bool causal_;
  float rate_;
  bool use_bias_;
  double init_std_, proj_init_std_;  // 0: Glorot uniform, as the dense layer
};

}  // namespace

KILN_CORE_OPS(attention) { add_core_layer("attention", factory<AttentionLayer>()); }

}  // namespace kiln::op_impl
