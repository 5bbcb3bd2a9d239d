// Dispatch from OpKind to the op families, and what this backend supports on a given device.
#include <array>
#include <string>
#include <variant>

#include "kiln/error.hpp"
#include "kiln/kernel_registry.hpp"
#include "kiln/op_table.hpp"
#include "vulkan_ops.hpp"

namespace kiln::vulkan {
namespace {

Support no(std::string why) { return {false, std::move(why)}; }

// Tiled kernels launch one workgroup per 64x64 output tile.
Support tiles_fit(int64_t rows, int64_t cols, const DeviceLimits& l) {
  if ((cols + 63) / 64 > l.max_groups[0] || (rows + 63) / 64 > l.max_groups[1])
    return no("output of " + std::to_string(rows) + "x" + std::to_string(cols) +
              " needs more 64x64 tiles than maxComputeWorkGroupCount allows");
  return {};
}

// One row (or item) of a kernel must fit the loop budget on its own: the host splits everything else.
Support row_fits(int64_t cost, int64_t fixed, const std::string& what) {
  if (inner_fits(cost, fixed)) return {};
  return no(what + " needs " + std::to_string(cost + fixed + 1) + " loop iterations in one shader invocation, above the " +
            std::to_string(kLoopBudget) + " these kernels allow themselves (llvmpipe ends an invocation's loops after " +
            "65535 iterations in all)");
}

Support window_fits(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t kh, int64_t kw) {
  constexpr int64_t kMax = 32768;  // window arithmetic in the kernels is done in 32-bit ints
  if (sh > kMax || sw > kMax || ph > kMax || pw > kMax || kh > kMax || kw > kMax)
    return no("strides, paddings and window sizes above " + std::to_string(kMax) + " are not supported");
  return {};
}

}  // namespace

Support op_support(OpKind kind, const OpAttrs& attrs, const DeviceLimits& limits) {
  const bool builtin = static_cast<size_t>(kind) < kBuiltinOpCount;
  if (!builtin) {
    if (!op_known(kind)) return no("unknown op kind " + std::to_string(static_cast<int>(kind)));
    if (!find_kernel<ShaderKernel>("vulkan", kind)) return no(missing_kernel_reason("vulkan", kind));
  }
  OpArity ar;
  try {
    ar = op_arity(kind, attrs);
  } catch (const Error& e) {
    return no(e.what());
  }
  auto check = [&](const std::vector<int64_t>& sizes, const char* what) -> Support {
    for (size_t i = 0; i < sizes.size(); ++i)
      if (static_cast<uint64_t>(sizes[i]) * sizeof(float) > limits.max_range)
        return no(std::string(what) + "[" + std::to_string(i) + "] holds " + std::to_string(sizes[i] * 4) +
                  " bytes, above this device's maxStorageBufferRange of " + std::to_string(limits.max_range));
    return {};
  };
  // Copy runs as vkCmdCopyBuffer (VulkanDevice::run), which binds no storage buffer: no range limit.
  if (kind != OpKind::Copy) {
    if (Support s = check(ar.in, "input"); !s.yes) return s;
    if (Support s = check(ar.out, "output"); !s.yes) return s;
  }

  if (!builtin) {
    if (ar.in.size() + ar.out.size() > 8) return no("a plugin's kernel binds at most 8 buffers");
    return {};
  }
  switch (kind) {
    case OpKind::Gemm: {
      const auto& a = std::get<GemmAttrs>(attrs);
      return tiles_fit(a.m, a.n, limits);  // K of any length: run in ranges of kTileMaxK
    }
    case OpKind::BatchedGemm: {
      const auto& a = std::get<GemmAttrs>(attrs);
      return tiles_fit(a.m, a.n, limits);  // batches in ranges of maxComputeWorkGroupCount[2], K in kTileMaxK
    }
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter: {
      const auto& a = std::get<ConvAttrs>(attrs);
      if (Support s = window_fits(a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.r, a.s); !s.yes) return s;
      if (kind == OpKind::Conv2dForward) return tiles_fit(a.n * a.oh * a.ow, a.k, limits);
      if (kind == OpKind::Conv2dBackwardData) return tiles_fit(a.n * a.h * a.w, a.c, limits);
      return tiles_fit(a.k, a.c * a.r * a.s, limits);
    }
    case OpKind::MaxPoolForward:
    case OpKind::MaxPoolBackward:
    case OpKind::AvgPoolForward:
    case OpKind::AvgPoolBackward: {
      const auto& a = std::get<PoolAttrs>(attrs);
      if (Support s = window_fits(a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.kh, a.kw); !s.yes) return s;
      return row_fits(pool_item_cost(kind, a), 0,
                      "a " + std::to_string(a.kh) + "x" + std::to_string(a.kw) + " window (stride " +
                          std::to_string(a.stride_h) + "x" + std::to_string(a.stride_w) + ")");
    }
    case OpKind::ActivationForward:
    case OpKind::ActivationBackward: {
      const auto& a = std::get<ActivationAttrs>(attrs);
      if (static_cast<int>(a.act) >= kActivationCount)
        return no("unknown activation " + std::to_string(static_cast<int>(a.act)));
      return {};
    }
    case OpKind::SoftmaxForward:
    case OpKind::SoftmaxBackward: {
      const int64_t cols = std::get<SoftmaxAttrs>(attrs).cols;
      return row_fits(softmax_row_cost(kind, cols), 0, "a row of cols = " + std::to_string(cols));
    }
    case OpKind::SoftmaxCrossEntropy: {
      const auto& a = std::get<LossAttrs>(attrs);
      return row_fits(sce_row_cost(a.cols, a.soft_labels), 8,
                      "a row of cols = " + std::to_string(a.cols) + (a.soft_labels ? " (probability labels)" : ""));
    }
    case OpKind::EmbeddingForward:
    case OpKind::EmbeddingBackward: {
      const auto& a = std::get<EmbeddingAttrs>(attrs);
      if (a.vocab >= (int64_t(1) << 24))  // ids are compared as floats, exact only below 2^24
        return no("vocab = " + std::to_string(a.vocab) + " exceeds 2^24, the largest id a float holds exactly");
      return {};
    }
    case OpKind::LayerNormForward:
    case OpKind::LayerNormBackward: {
      const int64_t cols = std::get<LayerNormAttrs>(attrs).cols;
      return row_fits(layer_norm_row_cost(kind, cols), 0, "a row of cols = " + std::to_string(cols));
    }
    default: return {};
  }
}

size_t op_workspace_bytes(const OpCall& call, const DeviceLimits& limits) {
  if (call.kind == OpKind::Conv2dForward || call.kind == OpKind::Conv2dBackwardData ||
      call.kind == OpKind::Conv2dBackwardFilter)
    return conv_workspace_bytes(call.kind, std::get<ConvAttrs>(call.attrs), limits);
  return 0;
}

// A plugin's op: its shader binds the inputs, then the outputs.
void run_shader(Encoder& e, const OpCall& c) {
  const ShaderKernel* k = find_kernel<ShaderKernel>("vulkan", c.kind);
  if (!k) throw DeviceError("vulkan: " + missing_kernel_reason("vulkan", c.kind));
  std::vector<Bind> binds;
  for (const auto& v : c.in) binds.push_back(rd(v));
  for (const auto& v : c.out) binds.push_back(wr(v));
  const std::array<uint32_t, 3> g = k->groups ? k->groups(c) : std::array<uint32_t, 3>{1, 1, 1};
  e.dispatch_shader(*k, binds, k->params ? k->params(c) : std::vector<uint32_t>{}, g[0], g[1], g[2]);
}

void run_op(Encoder& e, const OpCall& c) {
  if (static_cast<size_t>(c.kind) >= kBuiltinOpCount) return run_shader(e, c);
  // Every built-in op has a case: a missing one fails to compile (-Wswitch as an error, no default).
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
  switch (c.kind) {
    case OpKind::Gemm: return run_gemm(e, c);
    case OpKind::BiasAdd:
    case OpKind::BiasGrad: return run_bias(e, c);
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter: return run_conv(e, c);
    case OpKind::MaxPoolForward:
    case OpKind::MaxPoolBackward:
    case OpKind::AvgPoolForward:
    case OpKind::AvgPoolBackward: return run_pool(e, c);
    case OpKind::ActivationForward:
    case OpKind::ActivationBackward: return run_activation(e, c);
    case OpKind::SoftmaxForward:
    case OpKind::SoftmaxBackward: return run_softmax(e, c);
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::MeanSquaredError:
    case OpKind::BinaryCrossEntropy: return run_loss(e, c);
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Axpby:
    case OpKind::Scale:
    case OpKind::Fill:
    case OpKind::Copy: return run_elementwise(e, c);
    case OpKind::ReduceSum: return run_reduce(e, c);
    case OpKind::Concat:
    case OpKind::Split: return run_concat(e, c);
    case OpKind::DropoutForward:
    case OpKind::DropoutBackward: return run_dropout(e, c);
    case OpKind::SgdUpdate:
    case OpKind::AdamUpdate:
    case OpKind::RmspropUpdate:
    case OpKind::EmaUpdate: return run_optimizer(e, c);
    case OpKind::EmbeddingForward:
    case OpKind::EmbeddingBackward: return run_embedding(e, c);
    case OpKind::LayerNormForward:
    case OpKind::LayerNormBackward: return run_layer_norm(e, c);
    case OpKind::SumSquares:
    case OpKind::ClipByGlobalNorm: return run_clip(e, c);
    case OpKind::BatchedGemm: return run_batched_gemm(e, c);
    case OpKind::Permute: return run_permute(e, c);
    case OpKind::BatchNormForward:
    case OpKind::BatchNormBackward: return run_batch_norm(e, c);
    case OpKind::Count_: break;
  }
#pragma GCC diagnostic pop
  throw DeviceError("vulkan: unknown op kind " + std::to_string(static_cast<int>(c.kind)));
}

}  // namespace kiln::vulkan
