// Dispatch from OpKind to the op families, and what this backend supports on a given device.
#include <string>
#include <variant>

#include "kiln/error.hpp"
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

  switch (kind) {
    case OpKind::Gemm: {
      const auto& a = std::get<GemmAttrs>(attrs);
      return tiles_fit(a.m, a.n, limits);  // K of any length: run in ranges of kTileMaxK
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
      if (static_cast<int>(a.act) > static_cast<int>(Activation::tanh))
        return no("unknown activation " + std::to_string(static_cast<int>(a.act)));
      return {};
    }
    case OpKind::SoftmaxForward:
    case OpKind::SoftmaxBackward: {
      const int64_t cols = std::get<SoftmaxAttrs>(attrs).cols;
      return row_fits(softmax_row_cost(kind, cols), 0, "a row of cols = " + std::to_string(cols));
    }
    case OpKind::SoftmaxCrossEntropy: {
      const int64_t cols = std::get<LossAttrs>(attrs).cols;
      return row_fits(softmax_row_cost(OpKind::SoftmaxForward, cols), 8, "a row of cols = " + std::to_string(cols));
    }
    default: return {};
  }
}

size_t op_workspace_bytes(const OpCall& call) {
  if (call.kind == OpKind::Conv2dBackwardFilter) return conv_workspace_bytes(std::get<ConvAttrs>(call.attrs));
  return 0;
}

void run_op(Encoder& e, const OpCall& c) {
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
    case OpKind::Count_: break;
  }
  throw DeviceError("vulkan: unknown op kind " + std::to_string(static_cast<int>(c.kind)));
}

}  // namespace kiln::vulkan
