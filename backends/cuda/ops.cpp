// The op dispatch of CudaDevice: validation, capability, workspace sizes, and which kernel or library call runs
// each op (semantics: core/include/kiln/ops.hpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "check.hpp"
#include "cuda_device.hpp"
#include "gemm.hpp"
#include "kernels.hpp"
#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"

namespace kiln::cuda {
namespace {

namespace k = kernels;

k::SgdParams sgd_params(const SgdAttrs& a) { return {a.lr, a.momentum, a.weight_decay, a.nesterov ? 1 : 0}; }
k::AdamParams adam_params(const AdamAttrs& a) {
  // Bias corrections in double on the host, exactly as the reference computes them.
  const double t = static_cast<double>(a.step);
  return {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, 1.0 - std::pow(double(a.beta1), t),
          1.0 - std::pow(double(a.beta2), t), a.decoupled_decay};
}
k::RmspropParams rmsprop_params(const RmspropAttrs& a) { return {a.lr, a.rho, a.eps, a.momentum}; }
k::EmaParams ema_params(const EmaAttrs& a) { return {a.decay}; }
k::DropoutParams dropout_params(const DropoutAttrs& a) { return {a.rate, a.seed, a.counter}; }

template <class P>
bool pack(const P& p, void* slot) {
  std::memset(slot, 0, k::kParamSlotBytes);
  std::memcpy(slot, &p, sizeof p);
  return true;
}

k::PoolShape pool_shape(const PoolAttrs& a) {
  return {a.n, a.c, a.h, a.w, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.oh, a.ow};
}

k::Loss loss_kind(OpKind kind, const LossAttrs& a) {
  if (kind == OpKind::SoftmaxCrossEntropy)
    return a.soft_labels ? k::Loss::softmax_cross_entropy_soft : k::Loss::softmax_cross_entropy;
  if (kind == OpKind::MeanSquaredError) return k::Loss::mse;
  return a.from_logits ? k::Loss::bce_logits : k::Loss::bce_probs;
}

bool is_loss(OpKind kind) { return op_desc(kind).is_loss; }

bool is_conv(OpKind kind) {
  return kind == OpKind::Conv2dForward || kind == OpKind::Conv2dBackwardData ||
         kind == OpKind::Conv2dBackwardFilter;
}

}  // namespace

bool pack_step_scalars(const OpCall& call, void* slot) {
  switch (call.kind) {
    case OpKind::SgdUpdate: return pack(sgd_params(std::get<SgdAttrs>(call.attrs)), slot);
    case OpKind::AdamUpdate: return pack(adam_params(std::get<AdamAttrs>(call.attrs)), slot);
    case OpKind::RmspropUpdate: return pack(rmsprop_params(std::get<RmspropAttrs>(call.attrs)), slot);
    case OpKind::EmaUpdate: return pack(ema_params(std::get<EmaAttrs>(call.attrs)), slot);
    case OpKind::DropoutForward:
    case OpKind::DropoutBackward: return pack(dropout_params(std::get<DropoutAttrs>(call.attrs)), slot);
    default: return false;
  }
}

Support CudaDevice::supports(OpKind kind, const OpAttrs& attrs) const {
  if (static_cast<size_t>(kind) >= kBuiltinOpCount) {
    if (!op_known(kind)) return {false, "unknown op kind " + std::to_string(static_cast<int>(kind))};
    if (!find_kernel<StreamKernel>("cuda", kind)) return {false, missing_kernel_reason("cuda", kind)};
    return {};
  }
  OpArity ar;
  try {
    ar = op_arity(kind, attrs);  // checks the attribute type
  } catch (const Error& e) {
    return {false, e.what()};
  }
  for (const auto* list : {&ar.in, &ar.out})
    for (int64_t n : *list)
      if (n < 0) return {false, std::string(op_name(kind)) + ": negative buffer size " + std::to_string(n)};
  if (kind == OpKind::Gemm || kind == OpKind::BatchedGemm) return gemm_supports(std::get<GemmAttrs>(attrs));
  if (is_conv(kind)) return ConvEngine::supports(std::get<ConvAttrs>(attrs));
  if (const auto* p = std::get_if<PoolAttrs>(&attrs)) {
    if (p->stride_h < 1 || p->stride_w < 1)
      return {false, "pooling strides must be >= 1, found " + std::to_string(p->stride_h) + "x" +
                         std::to_string(p->stride_w)};
    if (p->pad_h < 0 || p->pad_w < 0 || p->kh < 0 || p->kw < 0)
      return {false, "pooling window and padding must be >= 0"};
  }
  if (const auto* a = std::get_if<AdamAttrs>(&attrs); a && a->step < 1)
    return {false, "adam_update needs step t >= 1, found " + std::to_string(a->step)};
  return {};
}

size_t CudaDevice::workspace_bytes(const OpCall& call) const {
  if (call.kind == OpKind::Gemm || call.kind == OpKind::BatchedGemm)
    return gemm_workspace_bytes(std::get<GemmAttrs>(call.attrs), cc_major_, workspace_limit_);
  if (is_conv(call.kind)) return conv_->workspace_bytes(call.kind, std::get<ConvAttrs>(call.attrs), workspace_limit_);
  if (static_cast<size_t>(call.kind) < kBuiltinOpCount && is_loss(call.kind)) {
    const auto& a = std::get<LossAttrs>(call.attrs);
    return k::loss_workspace_bytes(loss_kind(call.kind, a), a.rows, a.cols);
  }
  return 0;
}

// Buffer counts and sizes were checked when the call was bound (check_call); what remains is CUDA's own.
void CudaDevice::validate(const OpCall& call) const {
  const std::string op = info_.label() + " op " + std::string(op_name(call.kind));
  // cuBLAS refuses a workspace below 256-byte alignment; the core allocator aligns every allocation to 256.
  if (call.workspace.block && call.workspace.bytes > 0 &&
      reinterpret_cast<uintptr_t>(static_cast<char*>(call.workspace.block->ptr) + call.workspace.offset) % 256 != 0)
    throw DeviceError(op + ": the workspace must start at a 256-byte aligned address, found offset " +
                      std::to_string(call.workspace.offset) + " in its block");
  if (static_cast<size_t>(call.kind) < kBuiltinOpCount && is_loss(call.kind)) {
    const size_t need = workspace_bytes(call);
    if (!call.workspace.block || call.workspace.bytes < need)
      throw DeviceError(op + ": needs a workspace of " + std::to_string(need) + " bytes, was given " +
                        std::to_string(call.workspace.bytes) + " (ask Device::workspace_bytes)");
  }
}

void CudaDevice::execute(const OpCall& c, const void* scalars) {
  cudaStream_t s = stream_.get();
  auto in = [&](size_t i) {
    return c.in[i].block ? reinterpret_cast<const float*>(static_cast<const char*>(c.in[i].block->ptr) + c.in[i].offset)
                         : nullptr;
  };
  auto out = [&](size_t i) {
    return c.out[i].block ? reinterpret_cast<float*>(static_cast<char*>(c.out[i].block->ptr) + c.out[i].offset)
                          : nullptr;
  };
  if (static_cast<size_t>(c.kind) >= kBuiltinOpCount) {  // a plugin's op
    const StreamKernel* kernel = find_kernel<StreamKernel>("cuda", c.kind);
    if (!kernel) throw DeviceError(info_.label() + ": " + missing_kernel_reason("cuda", c.kind));
    return kernel->run(c, s);
  }
  // Every built-in op has a case: a missing one fails to compile (-Wswitch as an error, no default).
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
  switch (c.kind) {
    case OpKind::Gemm: return gemm_run(cublas_.get(), s, std::get<GemmAttrs>(c.attrs), c, tf32_);
    case OpKind::BiasAdd: {
      const auto& a = std::get<BiasAttrs>(c.attrs);
      return k::bias_add(s, in(0), in(1), out(0), a.outer, a.channels, a.inner);
    }
    case OpKind::BiasGrad: {
      const auto& a = std::get<BiasAttrs>(c.attrs);
      return k::bias_grad(s, in(0), out(0), a.outer, a.channels, a.inner);
    }
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter:
      return conv_->run(c.kind, std::get<ConvAttrs>(c.attrs), c, s, workspace_limit_);
    case OpKind::MaxPoolForward: return k::max_pool_forward(s, pool_shape(std::get<PoolAttrs>(c.attrs)), in(0), out(0));
    case OpKind::MaxPoolBackward:
      return k::max_pool_backward(s, pool_shape(std::get<PoolAttrs>(c.attrs)), in(0), in(1), in(2), out(0));
    case OpKind::AvgPoolForward: return k::avg_pool_forward(s, pool_shape(std::get<PoolAttrs>(c.attrs)), in(0), out(0));
    case OpKind::AvgPoolBackward:
      return k::avg_pool_backward(s, pool_shape(std::get<PoolAttrs>(c.attrs)), in(0), out(0));
    case OpKind::ActivationForward: {
      const auto& a = std::get<ActivationAttrs>(c.attrs);
      return k::activation_forward(s, static_cast<k::Act>(a.act), in(0), out(0), a.count);
    }
    case OpKind::ActivationBackward: {
      const auto& a = std::get<ActivationAttrs>(c.attrs);
      return k::activation_backward(s, static_cast<k::Act>(a.act), in(0), in(1), out(0), a.count);
    }
    case OpKind::SoftmaxForward: {
      const auto& a = std::get<SoftmaxAttrs>(c.attrs);
      return k::softmax_forward(s, in(0), out(0), a.rows, a.cols, a.causal);
    }
    case OpKind::SoftmaxBackward: {
      const auto& a = std::get<SoftmaxAttrs>(c.attrs);
      return k::softmax_backward(s, in(0), in(1), out(0), a.rows, a.cols);
    }
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::MeanSquaredError:
    case OpKind::BinaryCrossEntropy: {
      const auto& a = std::get<LossAttrs>(c.attrs);
      void* ws = static_cast<char*>(c.workspace.block->ptr) + c.workspace.offset;
      return k::loss(s, loss_kind(c.kind, a), in(0), in(1), out(0), out(1), a.rows, a.cols, a.scale, ws);
    }
    case OpKind::Add: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::add(s, in(0), in(1), out(0), a.count, a.alpha, a.beta);
    }
    case OpKind::Mul: return k::mul(s, in(0), in(1), out(0), std::get<ElementwiseAttrs>(c.attrs).count);
    case OpKind::Axpby: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::axpby(s, in(0), out(0), a.count, a.alpha, a.beta);
    }
    case OpKind::Scale: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::scale(s, in(0), out(0), a.count, a.alpha);
    }
    case OpKind::Fill: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::fill(s, out(0), a.count, a.alpha);
    }
    case OpKind::Copy: {
      const auto n = static_cast<size_t>(std::get<ElementwiseAttrs>(c.attrs).count) * sizeof(float);
      if (n > 0) KILN_CUDA_CHECK(cudaMemcpyAsync(out(0), in(0), n, cudaMemcpyDeviceToDevice, s));
      return;
    }
    case OpKind::ReduceSum: {
      const auto& a = std::get<ReduceAttrs>(c.attrs);
      return k::reduce_sum(s, in(0), out(0), a.outer, a.reduce, a.inner);
    }
    case OpKind::Concat:
    case OpKind::Split: {
      // Part j is a (outer x sizes[j]*inner) block of rows inside the whole's (outer x total*inner) rows.
      const auto& a = std::get<ConcatAttrs>(c.attrs);
      int64_t total = 0;
      for (int64_t v : a.sizes) total += v;
      const size_t whole_pitch = static_cast<size_t>(total * a.inner) * sizeof(float);
      size_t start = 0;  // byte offset of part j inside a row of the whole
      for (size_t j = 0; j < a.sizes.size(); ++j) {
        const size_t width = static_cast<size_t>(a.sizes[j] * a.inner) * sizeof(float);
        if (width > 0 && a.outer > 0) {
          char* whole = c.kind == OpKind::Concat ? reinterpret_cast<char*>(out(0))
                                                 : const_cast<char*>(reinterpret_cast<const char*>(in(0)));
          char* part = c.kind == OpKind::Concat ? const_cast<char*>(reinterpret_cast<const char*>(in(j)))
                                                : reinterpret_cast<char*>(out(j));
          if (c.kind == OpKind::Concat)
            KILN_CUDA_CHECK(cudaMemcpy2DAsync(whole + start, whole_pitch, part, width, width,
                                              static_cast<size_t>(a.outer), cudaMemcpyDeviceToDevice, s));
          else
            KILN_CUDA_CHECK(cudaMemcpy2DAsync(part, width, whole + start, whole_pitch, width,
                                              static_cast<size_t>(a.outer), cudaMemcpyDeviceToDevice, s));
        }
        start += width;
      }
      return;
    }
    case OpKind::DropoutForward:
    case OpKind::DropoutBackward: {
      const auto& a = std::get<DropoutAttrs>(c.attrs);
      return k::dropout(s, in(0), out(0), a.count, dropout_params(a), static_cast<const k::DropoutParams*>(scalars));
    }
    case OpKind::SgdUpdate: {
      const auto& a = std::get<SgdAttrs>(c.attrs);
      return k::sgd(s, in(0), out(0), out(1), a.count, sgd_params(a), static_cast<const k::SgdParams*>(scalars));
    }
    case OpKind::AdamUpdate: {
      const auto& a = std::get<AdamAttrs>(c.attrs);
      return k::adam(s, in(0), out(0), out(1), out(2), a.count, adam_params(a),
                     static_cast<const k::AdamParams*>(scalars));
    }
    case OpKind::RmspropUpdate: {
      const auto& a = std::get<RmspropAttrs>(c.attrs);
      return k::rmsprop(s, in(0), out(0), out(1), out(2), a.count, rmsprop_params(a),
                        static_cast<const k::RmspropParams*>(scalars));
    }
    case OpKind::EmaUpdate: {
      const auto& a = std::get<EmaAttrs>(c.attrs);
      return k::ema(s, in(0), out(0), a.count, ema_params(a), static_cast<const k::EmaParams*>(scalars));
    }
    case OpKind::EmbeddingForward:
    case OpKind::EmbeddingBackward: {
      const auto& a = std::get<EmbeddingAttrs>(c.attrs);
      if (c.kind == OpKind::EmbeddingForward) return k::embedding_forward(s, in(0), in(1), out(0), a.rows, a.vocab, a.dim);
      return k::embedding_backward(s, in(0), in(1), out(0), a.rows, a.vocab, a.dim);
    }
    case OpKind::LayerNormForward: {
      const auto& a = std::get<LayerNormAttrs>(c.attrs);
      return k::layer_norm_forward(s, in(0), in(1), a.bias ? in(2) : nullptr, out(0), out(1), out(2), a.rows, a.cols,
                                   a.eps);
    }
    case OpKind::LayerNormBackward: {
      const auto& a = std::get<LayerNormAttrs>(c.attrs);
      return k::layer_norm_backward(s, in(0), in(1), in(2), in(3), in(4), out(0), out(1), a.bias ? out(2) : nullptr,
                                    a.rows, a.cols);
    }
    case OpKind::SumSquares: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::sum_squares(s, in(0), out(0), a.count, a.alpha, a.beta);
    }
    case OpKind::ClipByGlobalNorm: {
      const auto& a = std::get<ElementwiseAttrs>(c.attrs);
      return k::clip_by_global_norm(s, in(0), out(0), a.count, a.alpha);
    }
    case OpKind::BatchedGemm: return batched_gemm_run(cublas_.get(), s, std::get<GemmAttrs>(c.attrs), c, tf32_);
    case OpKind::Permute: {
      const auto& a = std::get<PermuteAttrs>(c.attrs);
      k::PermuteShape p{static_cast<int>(a.rank), {}, {}};
      int64_t xstride[kPermuteMaxRank], n = 1;
      for (int64_t i = a.rank - 1; i >= 0; --i) xstride[i] = n, n *= a.dims[i];
      for (int64_t i = 0; i < a.rank; ++i) p.ydims[i] = a.dims[a.perm[i]], p.steps[i] = xstride[a.perm[i]];
      return k::permute(s, in(0), out(0), p, n);
    }
    case OpKind::BatchNormForward: {
      const auto& a = std::get<BatchNormAttrs>(c.attrs);
      return k::batch_norm_forward(s, in(0), in(1), in(2), out(0), out(1), out(2), out(3), out(4), a.n, a.c, a.inner,
                                   a.eps, a.momentum, a.training);
    }
    case OpKind::BatchNormBackward: {
      const auto& a = std::get<BatchNormAttrs>(c.attrs);
      return k::batch_norm_backward(s, in(0), in(1), in(2), in(3), in(4), out(0), out(1), out(2), a.n, a.c, a.inner,
                                    a.training);
    }
    case OpKind::Count_: break;
  }
#pragma GCC diagnostic pop
  throw DeviceError(info_.label() + ": unknown op kind " + std::to_string(static_cast<int>(c.kind)));
}

}  // namespace kiln::cuda
