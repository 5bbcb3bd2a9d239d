// Op names and exact buffer sizes of every op (the contract in ops.hpp, checked by executors and tests).
#include "kiln/ops.hpp"

#include <string>
#include <type_traits>
#include <utility>

#include "kiln/error.hpp"

namespace kiln {

std::string_view op_name(OpKind k) {
  switch (k) {
    case OpKind::Gemm:
      return "gemm";
    case OpKind::BiasAdd:
      return "bias_add";
    case OpKind::BiasGrad:
      return "bias_grad";
    case OpKind::Conv2dForward:
      return "conv2d_forward";
    case OpKind::Conv2dBackwardData:
      return "conv2d_backward_data";
    case OpKind::Conv2dBackwardFilter:
      return "conv2d_backward_filter";
    case OpKind::MaxPoolForward:
      return "max_pool_forward";
    case OpKind::MaxPoolBackward:
      return "max_pool_backward";
    case OpKind::AvgPoolForward:
      return "avg_pool_forward";
    case OpKind::AvgPoolBackward:
      return "avg_pool_backward";
    case OpKind::ActivationForward:
      return "activation_forward";
    case OpKind::ActivationBackward:
      return "activation_backward";
    case OpKind::SoftmaxForward:
      return "softmax_forward";
    case OpKind::SoftmaxBackward:
      return "softmax_backward";
    case OpKind::SoftmaxCrossEntropy:
      return "softmax_cross_entropy";
    case OpKind::MeanSquaredError:
      return "mean_squared_error";
    case OpKind::BinaryCrossEntropy:
      return "binary_cross_entropy";
    case OpKind::Add:
      return "add";
    case OpKind::Mul:
      return "mul";
    case OpKind::Axpby:
      return "axpby";
    case OpKind::Scale:
      return "scale";
    case OpKind::Fill:
      return "fill";
    case OpKind::Copy:
      return "copy";
    case OpKind::ReduceSum:
      return "reduce_sum";
    case OpKind::Concat:
      return "concat";
    case OpKind::Split:
      return "split";
    case OpKind::DropoutForward:
      return "dropout_forward";
    case OpKind::DropoutBackward:
      return "dropout_backward";
    case OpKind::SgdUpdate:
      return "sgd_update";
    case OpKind::AdamUpdate:
      return "adam_update";
    case OpKind::RmspropUpdate:
      return "rmsprop_update";
    case OpKind::EmaUpdate:
      return "ema_update";
    case OpKind::Count_:
      break;
  }
  return "unknown_op";
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::sigmoid:
      return "sigmoid";
    case Activation::tanh:
      return "tanh";
  }
  return "unknown_activation";
}

namespace {

constexpr const char* kAttrNames[] = {"GemmAttrs",       "BiasAttrs",    "ConvAttrs",    "PoolAttrs",
                                      "ActivationAttrs", "SoftmaxAttrs", "LossAttrs",    "ElementwiseAttrs",
                                      "ReduceAttrs",     "ConcatAttrs",  "DropoutAttrs", "SgdAttrs",
                                      "AdamAttrs",       "RmspropAttrs", "EmaAttrs"};
static_assert(std::size(kAttrNames) == std::variant_size_v<OpAttrs>);

template <class T, size_t... I>
constexpr size_t index_of(std::index_sequence<I...>) {
  size_t r = 0;
  ((std::is_same_v<T, std::variant_alternative_t<I, OpAttrs>> ? (r = I, 0) : 0), ...);
  return r;
}

template <class T>
const T& attrs_as(OpKind k, const OpAttrs& a) {
  if (const T* p = std::get_if<T>(&a)) return *p;
  constexpr size_t want = index_of<T>(std::make_index_sequence<std::variant_size_v<OpAttrs>>{});
  throw Error("op " + std::string(op_name(k)) + ": expected attributes " + kAttrNames[want] + ", found " +
              kAttrNames[a.index()]);
}

// Every size an op is given must be >= 0; a negative one is a bug in whoever built the attrs.
void check_dims(OpKind k, std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (const auto& [name, v] : dims)
    if (v < 0)
      throw Error("op " + std::string(op_name(k)) + ": attribute " + name + " must be >= 0, found " +
                  std::to_string(v));
}

}  // namespace

OpArity op_arity(OpKind k, const OpAttrs& attrs) {
  switch (k) {
    case OpKind::Gemm: {
      const auto& a = attrs_as<GemmAttrs>(k, attrs);
      check_dims(k, {{"m", a.m}, {"n", a.n}, {"k", a.k}});
      return {{a.m * a.k, a.k * a.n}, {a.m * a.n}};
    }
    case OpKind::BiasAdd:
    case OpKind::BiasGrad: {
      const auto& a = attrs_as<BiasAttrs>(k, attrs);
      check_dims(k, {{"outer", a.outer}, {"channels", a.channels}, {"inner", a.inner}});
      const int64_t all = a.outer * a.channels * a.inner;
      if (k == OpKind::BiasAdd) return {{all, a.channels}, {all}};
      return {{all}, {a.channels}};
    }
    case OpKind::Conv2dForward:
    case OpKind::Conv2dBackwardData:
    case OpKind::Conv2dBackwardFilter: {
      const auto& a = attrs_as<ConvAttrs>(k, attrs);
      check_dims(k, {{"n", a.n},
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
      if (a.stride_h < 1 || a.stride_w < 1)
        throw Error("op " + std::string(op_name(k)) + ": strides must be >= 1, found " + std::to_string(a.stride_h) +
                    "x" + std::to_string(a.stride_w));
      const int64_t x = a.n * a.c * a.h * a.w, w = a.k * a.c * a.r * a.s, y = a.n * a.k * a.oh * a.ow;
      if (k == OpKind::Conv2dForward) return {{x, w}, {y}};
      if (k == OpKind::Conv2dBackwardData) return {{y, w}, {x}};
      return {{x, y}, {w}};
    }
    case OpKind::MaxPoolForward:
    case OpKind::MaxPoolBackward:
    case OpKind::AvgPoolForward:
    case OpKind::AvgPoolBackward: {
      const auto& a = attrs_as<PoolAttrs>(k, attrs);
      check_dims(k, {{"n", a.n},
                     {"c", a.c},
                     {"h", a.h},
                     {"w", a.w},
                     {"kh", a.kh},
                     {"kw", a.kw},
                     {"pad_h", a.pad_h},
                     {"pad_w", a.pad_w},
                     {"oh", a.oh},
                     {"ow", a.ow}});
      if (a.stride_h < 1 || a.stride_w < 1)
        throw Error("op " + std::string(op_name(k)) + ": strides must be >= 1, found " + std::to_string(a.stride_h) +
                    "x" + std::to_string(a.stride_w));
      const int64_t x = a.n * a.c * a.h * a.w, y = a.n * a.c * a.oh * a.ow;
      if (k == OpKind::MaxPoolForward || k == OpKind::AvgPoolForward) return {{x}, {y}};
      if (k == OpKind::MaxPoolBackward) return {{x, y, y}, {x}};
      return {{y}, {x}};
    }
    case OpKind::ActivationForward:
    case OpKind::ActivationBackward: {
      const auto& a = attrs_as<ActivationAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      if (k == OpKind::ActivationForward) return {{a.count}, {a.count}};
      return {{a.count, a.count}, {a.count}};
    }
    case OpKind::SoftmaxForward:
    case OpKind::SoftmaxBackward: {
      const auto& a = attrs_as<SoftmaxAttrs>(k, attrs);
      check_dims(k, {{"rows", a.rows}, {"cols", a.cols}});
      const int64_t n = a.rows * a.cols;
      if (k == OpKind::SoftmaxForward) return {{n}, {n}};
      return {{n, n}, {n}};
    }
    case OpKind::SoftmaxCrossEntropy:
    case OpKind::MeanSquaredError:
    case OpKind::BinaryCrossEntropy: {
      const auto& a = attrs_as<LossAttrs>(k, attrs);
      check_dims(k, {{"rows", a.rows}, {"cols", a.cols}});
      const int64_t n = a.rows * a.cols;
      if (k == OpKind::SoftmaxCrossEntropy) return {{n, a.rows}, {1, n}};
      return {{n, n}, {1, n}};
    }
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Axpby:
    case OpKind::Scale:
    case OpKind::Fill:
    case OpKind::Copy: {
      const auto& a = attrs_as<ElementwiseAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      if (k == OpKind::Add || k == OpKind::Mul) return {{a.count, a.count}, {a.count}};
      if (k == OpKind::Fill) return {{}, {a.count}};
      return {{a.count}, {a.count}};
    }
    case OpKind::ReduceSum: {
      const auto& a = attrs_as<ReduceAttrs>(k, attrs);
      check_dims(k, {{"outer", a.outer}, {"reduce", a.reduce}, {"inner", a.inner}});
      return {{a.outer * a.reduce * a.inner}, {a.outer * a.inner}};
    }
    case OpKind::Concat:
    case OpKind::Split: {
      const auto& a = attrs_as<ConcatAttrs>(k, attrs);
      check_dims(k, {{"outer", a.outer}, {"inner", a.inner}});
      std::vector<int64_t> parts;
      int64_t total = 0;
      for (size_t j = 0; j < a.sizes.size(); ++j) {
        const std::string key = "sizes[" + std::to_string(j) + "]";
        check_dims(k, {{key.c_str(), a.sizes[j]}});
        parts.push_back(a.outer * a.sizes[j] * a.inner);
        total += a.sizes[j];
      }
      if (k == OpKind::Concat) return {parts, {a.outer * total * a.inner}};
      return {{a.outer * total * a.inner}, parts};
    }
    case OpKind::DropoutForward:
    case OpKind::DropoutBackward: {
      const auto& a = attrs_as<DropoutAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      if (!(a.rate >= 0.f && a.rate <= 1.f))
        throw Error("op " + std::string(op_name(k)) + ": rate must be in [0, 1], found " + std::to_string(a.rate));
      return {{a.count}, {a.count}};
    }
    case OpKind::SgdUpdate: {
      const auto& a = attrs_as<SgdAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      return {{a.count}, {a.count, a.count}};
    }
    case OpKind::AdamUpdate: {
      const auto& a = attrs_as<AdamAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      if (a.step < 1) throw Error("op adam_update: step must be >= 1, found " + std::to_string(a.step));
      return {{a.count}, {a.count, a.count, a.count}};
    }
    case OpKind::RmspropUpdate: {
      const auto& a = attrs_as<RmspropAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      return {{a.count}, {a.count, a.count, a.count}};
    }
    case OpKind::EmaUpdate: {
      const auto& a = attrs_as<EmaAttrs>(k, attrs);
      check_dims(k, {{"count", a.count}});
      return {{a.count}, {a.count}};
    }
    case OpKind::Count_:
      break;
  }
  throw Error("op_arity: unknown op kind " + std::to_string(static_cast<int>(k)));
}

}  // namespace kiln
