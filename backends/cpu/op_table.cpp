// The CPU backend's kernel table: one entry per built-in op, in OpKind order (a missing op fails to compile),
// and plugins' ops through the kernels they register for "cpu" (HostKernel). Calls arrive checked
// (check_call, when the executor binds), so kernels take their buffers as they come.
#include <array>
#include <limits>
#include <string>

#include "backend.hpp"
#include "kernels.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cpu {

struct CpuKernels {
  using Run = void (*)(CpuDevice&, const OpCall&);
  struct Entry {
    OpKind kind;
    Run run;
  };

  static const float* in(const OpCall& c, size_t i) { return c.in[i].block ? c.in[i].host() : nullptr; }
  static float* out(const OpCall& c, size_t i) { return c.out[i].block ? c.out[i].host() : nullptr; }
  static float* ws(const OpCall& c) { return c.workspace.block ? c.workspace.host() : nullptr; }
  template <class A>
  static const A& at(const OpCall& c) {
    return std::get<A>(c.attrs);
  }

  static void gemm(CpuDevice& d, const OpCall& c) { cpu::gemm(at<GemmAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_); }
  static void bias_add(CpuDevice& d, const OpCall& c) { cpu::bias_add(at<BiasAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_); }
  static void bias_grad(CpuDevice& d, const OpCall& c) { cpu::bias_grad(at<BiasAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void conv_fwd(CpuDevice& d, const OpCall& c) {
    conv2d_forward(at<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0), ws(c), d.pool_, d.winograd_);
  }
  static void conv_bwd_data(CpuDevice& d, const OpCall& c) {
    conv2d_backward_data(at<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0), ws(c), d.pool_, d.winograd_);
  }
  static void conv_bwd_filter(CpuDevice& d, const OpCall& c) {
    conv2d_backward_filter(at<ConvAttrs>(c), in(c, 0), in(c, 1), out(c, 0), ws(c), d.pool_, d.winograd_);
  }
  static void max_fwd(CpuDevice& d, const OpCall& c) { max_pool_forward(at<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void max_bwd(CpuDevice& d, const OpCall& c) {
    max_pool_backward(at<PoolAttrs>(c), in(c, 0), in(c, 1), in(c, 2), out(c, 0), d.pool_);
  }
  static void avg_fwd(CpuDevice& d, const OpCall& c) { avg_pool_forward(at<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void avg_bwd(CpuDevice& d, const OpCall& c) { avg_pool_backward(at<PoolAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void act_fwd(CpuDevice& d, const OpCall& c) { activation_forward(at<ActivationAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void act_bwd(CpuDevice& d, const OpCall& c) {
    activation_backward(at<ActivationAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_);
  }
  static void softmax_fwd(CpuDevice& d, const OpCall& c) { softmax_forward(at<SoftmaxAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void softmax_bwd(CpuDevice& d, const OpCall& c) {
    softmax_backward(at<SoftmaxAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_);
  }
  static void sce(CpuDevice& d, const OpCall& c) {
    softmax_cross_entropy(at<LossAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.partials_.data(), d.pool_);
  }
  static void mse(CpuDevice& d, const OpCall& c) {
    mean_squared_error(at<LossAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.partials_.data(), d.pool_);
  }
  static void bce(CpuDevice& d, const OpCall& c) {
    binary_cross_entropy(at<LossAttrs>(c), in(c, 0), in(c, 1), out(c, 0), out(c, 1), d.partials_.data(), d.pool_);
  }
  static void add(CpuDevice& d, const OpCall& c) { cpu::add(at<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_); }
  static void mul(CpuDevice& d, const OpCall& c) { cpu::mul(at<ElementwiseAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_); }
  static void axpby(CpuDevice& d, const OpCall& c) { cpu::axpby(at<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void scale(CpuDevice& d, const OpCall& c) { cpu::scale(at<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void fill(CpuDevice& d, const OpCall& c) { cpu::fill(at<ElementwiseAttrs>(c), out(c, 0), d.pool_); }
  static void copy(CpuDevice& d, const OpCall& c) { cpu::copy(at<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void reduce_sum(CpuDevice& d, const OpCall& c) { cpu::reduce_sum(at<ReduceAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void concat(CpuDevice& d, const OpCall& c) {
    const auto& a = at<ConcatAttrs>(c);
    if (d.part_ptrs_.size() < a.sizes.size()) d.part_ptrs_.resize(a.sizes.size());  // grows once per shape
    for (size_t j = 0; j < a.sizes.size(); ++j) d.part_ptrs_[j] = const_cast<float*>(in(c, j));
    cpu::concat(a, d.part_ptrs_.data(), out(c, 0), d.pool_);
  }
  static void split(CpuDevice& d, const OpCall& c) {
    const auto& a = at<ConcatAttrs>(c);
    if (d.part_ptrs_.size() < a.sizes.size()) d.part_ptrs_.resize(a.sizes.size());
    for (size_t j = 0; j < a.sizes.size(); ++j) d.part_ptrs_[j] = out(c, j);
    cpu::split(a, in(c, 0), d.part_ptrs_.data(), d.pool_);
  }
  static void dropout(CpuDevice& d, const OpCall& c) { cpu::dropout(at<DropoutAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void sgd(CpuDevice& d, const OpCall& c) {
    const auto& a = at<SgdAttrs>(c);
    sgd_update(a, in(c, 0), out(c, 0), a.momentum == 0.f ? nullptr : out(c, 1), d.pool_);
  }
  static void adam(CpuDevice& d, const OpCall& c) {
    adam_update(at<AdamAttrs>(c), in(c, 0), out(c, 0), out(c, 1), out(c, 2), d.pool_);
  }
  static void rmsprop(CpuDevice& d, const OpCall& c) {
    const auto& a = at<RmspropAttrs>(c);
    rmsprop_update(a, in(c, 0), out(c, 0), out(c, 1), a.momentum > 0.f ? out(c, 2) : nullptr, d.pool_);
  }
  static void ema(CpuDevice& d, const OpCall& c) { ema_update(at<EmaAttrs>(c), in(c, 0), out(c, 0), d.pool_); }
  static void embed_fwd(CpuDevice& d, const OpCall& c) {
    embedding_forward(at<EmbeddingAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_);
  }
  static void embed_bwd(CpuDevice& d, const OpCall& c) {
    embedding_backward(at<EmbeddingAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_);
  }

  static void ln_fwd(CpuDevice& d, const OpCall& c) {
    const auto& a = at<LayerNormAttrs>(c);
    layer_norm_forward(a, in(c, 0), in(c, 1), a.bias ? in(c, 2) : nullptr, out(c, 0), out(c, 1), out(c, 2), d.pool_);
  }
  static void ln_bwd(CpuDevice& d, const OpCall& c) {
    const auto& a = at<LayerNormAttrs>(c);
    layer_norm_backward(a, in(c, 0), in(c, 1), in(c, 2), in(c, 3), in(c, 4), out(c, 0), out(c, 1),
                        a.bias ? out(c, 2) : nullptr, d.pool_);
  }
  static void sum_sq(CpuDevice& d, const OpCall& c) {
    sum_squares(at<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.partials_.data(), d.pool_);
  }
  static void clip(CpuDevice& d, const OpCall& c) {
    clip_by_global_norm(at<ElementwiseAttrs>(c), in(c, 0), out(c, 0), d.pool_);
  }

  static void batched_gemm(CpuDevice& d, const OpCall& c) {
    cpu::batched_gemm(at<GemmAttrs>(c), in(c, 0), in(c, 1), out(c, 0), d.pool_);
  }
  static void permute(CpuDevice& d, const OpCall& c) { cpu::permute(at<PermuteAttrs>(c), in(c, 0), out(c, 0), d.pool_); }

  static void bn_fwd(CpuDevice& d, const OpCall& c) {
    batch_norm_forward(at<BatchNormAttrs>(c), in(c, 0), in(c, 1), in(c, 2), out(c, 0), out(c, 1), out(c, 2), out(c, 3),
                       out(c, 4), d.pool_);
  }
  static void bn_bwd(CpuDevice& d, const OpCall& c) {
    batch_norm_backward(at<BatchNormAttrs>(c), in(c, 0), in(c, 1), in(c, 2), in(c, 3), in(c, 4), out(c, 0), out(c, 1),
                        out(c, 2), d.pool_);
  }

  // Every built-in op, in OpKind order. This backend implements all of them.
  static constexpr Entry kTable[] = {
      {OpKind::Gemm, gemm},
      {OpKind::BiasAdd, bias_add},
      {OpKind::BiasGrad, bias_grad},
      {OpKind::Conv2dForward, conv_fwd},
      {OpKind::Conv2dBackwardData, conv_bwd_data},
      {OpKind::Conv2dBackwardFilter, conv_bwd_filter},
      {OpKind::MaxPoolForward, max_fwd},
      {OpKind::MaxPoolBackward, max_bwd},
      {OpKind::AvgPoolForward, avg_fwd},
      {OpKind::AvgPoolBackward, avg_bwd},
      {OpKind::ActivationForward, act_fwd},
      {OpKind::ActivationBackward, act_bwd},
      {OpKind::SoftmaxForward, softmax_fwd},
      {OpKind::SoftmaxBackward, softmax_bwd},
      {OpKind::SoftmaxCrossEntropy, sce},
      {OpKind::MeanSquaredError, mse},
      {OpKind::BinaryCrossEntropy, bce},
      {OpKind::Add, add},
      {OpKind::Mul, mul},
      {OpKind::Axpby, axpby},
      {OpKind::Scale, scale},
      {OpKind::Fill, fill},
      {OpKind::Copy, copy},
      {OpKind::ReduceSum, reduce_sum},
      {OpKind::Concat, concat},
      {OpKind::Split, split},
      {OpKind::DropoutForward, dropout},
      {OpKind::DropoutBackward, dropout},
      {OpKind::SgdUpdate, sgd},
      {OpKind::AdamUpdate, adam},
      {OpKind::RmspropUpdate, rmsprop},
      {OpKind::EmaUpdate, ema},
      {OpKind::EmbeddingForward, embed_fwd},
      {OpKind::EmbeddingBackward, embed_bwd},
      {OpKind::LayerNormForward, ln_fwd},
      {OpKind::LayerNormBackward, ln_bwd},
      {OpKind::SumSquares, sum_sq},
      {OpKind::ClipByGlobalNorm, clip},
      {OpKind::BatchedGemm, batched_gemm},
      {OpKind::Permute, permute},
      {OpKind::BatchNormForward, bn_fwd},
      {OpKind::BatchNormBackward, bn_bwd},
  };
};

constexpr bool in_op_order() {
  for (size_t i = 0; i < std::size(CpuKernels::kTable); ++i)
    if (static_cast<size_t>(CpuKernels::kTable[i].kind) != i) return false;
  return true;
}
static_assert(std::size(CpuKernels::kTable) == kBuiltinOpCount, "the CPU kernel table must have one entry per built-in op");
static_assert(in_op_order(), "the CPU kernel table must list the ops in OpKind order");

Support CpuDevice::supports(OpKind kind, const OpAttrs& attrs) const {
  if (static_cast<size_t>(kind) >= kBuiltinOpCount) {
    if (!op_known(kind)) return {false, "unknown op kind " + std::to_string(static_cast<int>(kind))};
    if (!find_kernel<HostKernel>("cpu", kind)) return {false, missing_kernel_reason("cpu", kind)};
    return {};
  }
  // BLAS takes 32-bit dimensions.
  auto blas = [](std::initializer_list<int64_t> dims) -> Support {
    for (int64_t d : dims)
      if (d > std::numeric_limits<int>::max())
        return {false, "a dimension of " + std::to_string(d) + " exceeds what BLAS can index (2^31 - 1)"};
    return {};
  };
  if (const auto* a = std::get_if<GemmAttrs>(&attrs); a && (kind == OpKind::Gemm || kind == OpKind::BatchedGemm))
    return blas({a->m, a->n, a->k});
  if (const auto* a = std::get_if<ConvAttrs>(&attrs))
    return blas({a->k, a->c * a->r * a->s, a->oh * a->ow});
  return {};
}

void CpuDevice::run(const OpCall& call) {
  const size_t k = static_cast<size_t>(call.kind);
  if (k < kBuiltinOpCount) return CpuKernels::kTable[k].run(*this, call);
  const HostKernel* kernel = find_kernel<HostKernel>("cpu", call.kind);
  if (!kernel) throw DeviceError(info_.label() + ": " + missing_kernel_reason("cpu", call.kind));
  kernel->run(call);
}

}  // namespace kiln::cpu
