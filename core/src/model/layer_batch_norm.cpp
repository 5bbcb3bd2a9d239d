// The batch_norm layer: PyTorch's nn.BatchNorm2d on (N, C, H, W) and nn.BatchNorm1d on (N, F).
#include <cmath>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/layer.hpp"
#include "kiln/plugin.hpp"

namespace kiln {

namespace {

// Training normalizes with the batch's per-channel statistics and updates the running statistics (buffers
// "<layer>.running_mean" = 0 and "<layer>.running_var" = 1 at start, checkpointed, never trained); evaluation
// graphs normalize with the running statistics. sync = true (PyTorch's SyncBatchNorm) makes data_parallel compute
// the statistics over the global batch, every replica's and process's rows; elsewhere one device holds the whole
// batch and it changes nothing. gamma (ones) and beta (zeros) are parameters, or with
// affine = false constant buffers (PyTorch's affine=False).
class BatchNormLayer : public Layer {
 public:
  explicit BatchNormLayer(const ConfigNode& c)
      : momentum_(c.get_float("momentum", 0.1)),
        eps_(c.get_float("epsilon", 1e-5)),
        affine_(c.get_bool("affine", true)) {
    if (!(momentum_ >= 0 && momentum_ <= 1))
      c.fail("momentum",
             "expected a number in [0, 1] such as 0.1 (PyTorch's default; the running statistics move "
             "by this fraction of the batch's each step), found " +
                 std::to_string(momentum_));
    if (!(eps_ > 0) || !std::isfinite(eps_) || eps_ > 1)
      c.fail("epsilon",
             "expected a small positive number such as 1e-5 (PyTorch's default), found " + std::to_string(eps_));
    sync_ = c.get_bool("sync", false);
    c.finish();
  }
  std::string type() const override { return "batch_norm"; }
  // x: (N, C, H, W) -> y: (N, C, H, W), statistics per channel over (N, H, W); x: (N, F) -> (N, F), per feature.
  TensorId build(GraphBuilder& g, std::span<const TensorId> in) const override {
    const Shape s = g.shape(in[0]);
    if (s.rank() != 2 && s.rank() != 4)
      throw ConfigError("layer '" + g.layer() +
                        "': batch_norm expects input (batch, channels, height, width) or "
                        "(batch, features), got " +
                        s.str());
    const int64_t c = s[1], inner = s.rank() == 4 ? s[2] * s[3] : 1;
    BatchNormAttrs a{s[0], c, inner, static_cast<float>(eps_), static_cast<float>(momentum_), g.training(), sync_};
    if (a.training && a.n * a.inner < 2)
      throw ConfigError("layer '" + g.layer() +
                        "': batch_norm in training needs more than one value per channel, "
                        "input " +
                        s.str() + " has " + std::to_string(a.n * a.inner) + " (raise [train] batch_size)");
    TensorId gamma, beta;
    if (affine_) {
      gamma = g.param("gamma", {c}, Init{InitKind::ones});
      beta = g.param("beta", {c}, Init{});
    } else {
      gamma = g.buffer("gamma", {c}, Init{InitKind::ones});
      beta = g.buffer("beta", {c}, Init{});
    }
    const TensorId running_mean = g.buffer("running_mean", {c}, Init{});
    const TensorId running_var = g.buffer("running_var", {c}, Init{InitKind::ones});
    std::vector<TensorId> outs = g.op(OpKind::BatchNormForward, a, {in[0], gamma, beta}, {s, {c}, {c}});
    // The running statistics are read-write outputs of the same node (no new storage).
    Node& n = g.graph().nodes().back();
    n.out.push_back(running_mean);
    n.out.push_back(running_var);
    return outs[0];
  }

 private:
  double momentum_, eps_;
  bool affine_;
  bool sync_ = false;  // statistics over every data_parallel replica's rows (the strategy does it; see ops.hpp)
};

}  // namespace

void register_batch_norm_layer(Registry& reg) {
  reg.add_layer("batch_norm",
                [](const ConfigNode& c) -> std::unique_ptr<Layer> { return std::make_unique<BatchNormLayer>(c); });
}

}  // namespace kiln
