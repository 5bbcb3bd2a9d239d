// The built-in op table: one descriptor per built-in op (name, attributes, buffer sizes, aliasing, loss role, step
// scalars, gradient rule, reference). Semantics: ops.hpp.
#include <algorithm>
#include <functional>
#include <span>

#include "kiln/strategy.hpp"
#include "op_table_impl.hpp"
#include "reference_impl.hpp"

namespace kiln::op_impl {

namespace {

template <class A>
int64_t counted(std::string_view op, const OpAttrs& attrs) {
  const auto& a = attrs_as<A>(op, attrs);
  check_dims(op, {{"count", a.count}});
  return a.count;
}

void check_activation(std::string_view op, const OpAttrs& attrs) {
  const int act = static_cast<int>(std::get<ActivationAttrs>(attrs).act);
  if (act < 0 || act >= kActivationCount)
    throw Error(op_label(op) + ": unknown activation " + std::to_string(act));
}

// ---- the built-in table -------------------------------------------------------------------------------------

using RefFn = std::function<void(const OpAttrs&, std::span<const float* const>, std::span<float* const>)>;

template <class A, void (*F)(const A&, ref::In, ref::Out)>
RefFn ref_of() {
  return [](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(std::get<A>(a), in.data(), out.data());
  };
}
template <class A, void (*F)(OpKind, const A&, ref::In, ref::Out)>
RefFn ref_of(OpKind k) {
  return [k](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
    F(k, std::get<A>(a), in.data(), out.data());
  };
}

template <class A>
OpDesc desc(const char* name, std::function<OpArity(const OpAttrs&)> arity, RefFn reference) {
  OpDesc d;
  d.name = name;
  d.attrs_index = attrs_index_of<A>;
  d.arity = std::move(arity);
  d.reference = std::move(reference);
  d.key = builtin_key;
  return d;
}

}  // namespace

std::vector<OpDesc> build_builtins() {
  using K = OpKind;
  std::vector<OpDesc> t(kBuiltinOpCount);
  auto set = [&](K k, OpDesc d) { t[static_cast<size_t>(k)] = std::move(d); };

  {
    OpDesc d = desc<GemmAttrs>("gemm", [](const OpAttrs& a) { return gemm_arity(K::Gemm, a); },
                               ref_of<GemmAttrs, ref::gemm>());
    d.grad = gemm_grad;
    set(K::Gemm, std::move(d));
  }
  {
    OpDesc d = desc<GemmAttrs>("batched_gemm", [](const OpAttrs& a) { return gemm_arity(K::BatchedGemm, a); },
                               ref_of<GemmAttrs, ref::batched_gemm>());
    d.grad = gemm_grad;
    set(K::BatchedGemm, std::move(d));
  }
  {
    OpDesc d = desc<PermuteAttrs>("permute", permute_arity, ref_of<PermuteAttrs, ref::permute>());
    d.grad = permute_grad;
    set(K::Permute, std::move(d));
  }
  {
    OpDesc d = desc<BiasAttrs>("bias_add", [](const OpAttrs& a) { return bias_arity(K::BiasAdd, a); },
                               ref_of<BiasAttrs, ref::bias_add>());
    d.may_alias = {{0, 0}};
    d.grad = bias_add_grad;
    set(K::BiasAdd, std::move(d));
  }
  set(K::BiasGrad, desc<BiasAttrs>("bias_grad", [](const OpAttrs& a) { return bias_arity(K::BiasGrad, a); },
                                   ref_of<BiasAttrs, ref::bias_grad>()));
  for (auto [k, name] : {std::pair{K::Conv2dForward, "conv2d_forward"},
                         std::pair{K::Conv2dBackwardData, "conv2d_backward_data"},
                         std::pair{K::Conv2dBackwardFilter, "conv2d_backward_filter"}}) {
    OpDesc d = desc<ConvAttrs>(name, [k = k, name = name](const OpAttrs& a) { return conv_arity(k, name, a); },
                               ref_of<ConvAttrs, ref::conv2d>(k));
    if (k == K::Conv2dForward) d.grad = conv_grad;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::MaxPoolForward, "max_pool_forward"},
                         std::pair{K::MaxPoolBackward, "max_pool_backward"},
                         std::pair{K::AvgPoolForward, "avg_pool_forward"},
                         std::pair{K::AvgPoolBackward, "avg_pool_backward"}}) {
    OpDesc d = desc<PoolAttrs>(name, [k = k, name = name](const OpAttrs& a) { return pool_arity(k, name, a); },
                               ref_of<PoolAttrs, ref::pool>(k));
    if (k == K::MaxPoolForward) d.grad = max_pool_grad;
    if (k == K::AvgPoolForward) d.grad = avg_pool_grad;
    set(k, std::move(d));
  }
  {
    OpDesc d = desc<ActivationAttrs>("activation_forward",
                                     [](const OpAttrs& a) -> OpArity {
                                       const int64_t n = counted<ActivationAttrs>("activation_forward", a);
                                       check_activation("activation_forward", a);
                                       return {{n}, {n}};
                                     },
                                     ref_of<ActivationAttrs, ref::activation>(K::ActivationForward));
    d.may_alias = {{0, 0}};
    d.grad = activation_grad;
    set(K::ActivationForward, std::move(d));
  }
  {
    OpDesc d = desc<ActivationAttrs>("activation_backward",
                                     [](const OpAttrs& a) -> OpArity {
                                       const int64_t n = counted<ActivationAttrs>("activation_backward", a);
                                       check_activation("activation_backward", a);
                                       return {{n, n}, {n}};
                                     },
                                     ref_of<ActivationAttrs, ref::activation>(K::ActivationBackward));
    d.may_alias = {{0, 1}};
    set(K::ActivationBackward, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::SoftmaxForward, "softmax_forward"}, std::pair{K::SoftmaxBackward, "softmax_backward"}}) {
    OpDesc d = desc<SoftmaxAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<SoftmaxAttrs>(name, attrs);
          check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
          const int64_t n = product(name, {a.rows, a.cols});
          if (k == K::SoftmaxForward) return {{n}, {n}};
          return {{n, n}, {n}};
        },
        ref_of<SoftmaxAttrs, ref::softmax>(k));
    if (k == K::SoftmaxForward) d.grad = from_output_grad<K::SoftmaxBackward>;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::SoftmaxCrossEntropy, "softmax_cross_entropy"},
                         std::pair{K::MeanSquaredError, "mean_squared_error"},
                         std::pair{K::BinaryCrossEntropy, "binary_cross_entropy"}}) {
    OpDesc d = desc<LossAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<LossAttrs>(name, attrs);
          check_dims(name, {{"rows", a.rows}, {"cols", a.cols}});
          const int64_t n = product(name, {a.rows, a.cols});
          if (k == K::SoftmaxCrossEntropy) return {{n, a.soft_labels ? n : a.rows}, {1, n}};
          return {{n, n}, {1, n}};
        },
        ref_of<LossAttrs, ref::loss>(k));
    d.is_loss = true;
    d.data_inputs = {1};
    d.grad = loss_grad;
    set(k, std::move(d));
  }
  struct Ew {
    K kind;
    const char* name;
    int inputs;
  };
  for (const Ew e : {Ew{K::Add, "add", 2}, Ew{K::Mul, "mul", 2}, Ew{K::Axpby, "axpby", 1}, Ew{K::Scale, "scale", 1},
                     Ew{K::Fill, "fill", 0}, Ew{K::Copy, "copy", 1}}) {
    OpDesc d = desc<ElementwiseAttrs>(
        e.name,
        [e](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<ElementwiseAttrs>(e.name, a);
          return {std::vector<int64_t>(static_cast<size_t>(e.inputs), n), {n}};
        },
        ref_of<ElementwiseAttrs, ref::elementwise>(e.kind));
    set(e.kind, std::move(d));
  }
  t[size_t(K::Add)].may_alias = {{0, 0}, {0, 1}};
  t[size_t(K::Add)].grad = add_grad;
  t[size_t(K::Mul)].may_alias = {{0, 0}, {0, 1}};
  t[size_t(K::Mul)].grad = mul_grad;
  t[size_t(K::Scale)].may_alias = {{0, 0}};
  t[size_t(K::Scale)].grad = scale_grad;
  t[size_t(K::Copy)].grad = copy_grad;
  set(K::ReduceSum, desc<ReduceAttrs>(
                        "reduce_sum",
                        [](const OpAttrs& attrs) -> OpArity {
                          const auto& a = attrs_as<ReduceAttrs>("reduce_sum", attrs);
                          check_dims("reduce_sum", {{"outer", a.outer}, {"reduce", a.reduce}, {"inner", a.inner}});
                          return {{product("reduce_sum", {a.outer, a.reduce, a.inner})},
                                  {product("reduce_sum", {a.outer, a.inner})}};
                        },
                        ref_of<ReduceAttrs, ref::reduce_sum>()));
  for (auto [k, name] : {std::pair{K::Concat, "concat"}, std::pair{K::Split, "split"}}) {
    OpDesc d = desc<ConcatAttrs>(
        name,
        [k = k, name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<ConcatAttrs>(name, attrs);
          check_dims(name, {{"outer", a.outer}, {"inner", a.inner}});
          std::vector<int64_t> parts;
          int64_t total = 0;
          for (size_t j = 0; j < a.sizes.size(); ++j) {
            const std::string key = "sizes[" + std::to_string(j) + "]";
            check_dims(name, {{key.c_str(), a.sizes[j]}});
            parts.push_back(product(name, {a.outer, a.sizes[j], a.inner}));
            if (__builtin_add_overflow(total, a.sizes[j], &total)) throw Error(op_label(name) + ": sizes overflow");
          }
          const int64_t whole = product(name, {a.outer, total, a.inner});
          if (k == K::Concat) return {parts, {whole}};
          return {{whole}, parts};
        },
        [concat = k == K::Concat](const OpAttrs& a, std::span<const float* const> in, std::span<float* const> out) {
          ref::concat_split(concat, std::get<ConcatAttrs>(a), in.data(), out.data());
        });
    d.grad = k == K::Concat ? concat_grad : split_grad;
    set(k, std::move(d));
  }
  for (auto [k, name] : {std::pair{K::DropoutForward, "dropout_forward"}, std::pair{K::DropoutBackward, "dropout_backward"}}) {
    OpDesc d = desc<DropoutAttrs>(
        name,
        [name = name](const OpAttrs& attrs) -> OpArity {
          const auto& a = attrs_as<DropoutAttrs>(name, attrs);
          check_dims(name, {{"count", a.count}});
          if (!(a.rate >= 0.f && a.rate <= 1.f))
            throw Error(op_label(name) + ": rate must be in [0, 1], found " + std::to_string(a.rate));
          return {{a.count}, {a.count}};
        },
        ref_of<DropoutAttrs, ref::dropout>());
    d.may_alias = {{0, 0}};
    d.step_scalars = kStepDropoutCounter;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<DropoutAttrs>(a).counter = static_cast<uint32_t>(s.step); };
    if (k == K::DropoutForward) d.grad = dropout_grad;
    set(k, std::move(d));
  }
  {
    OpDesc d = desc<SgdAttrs>("sgd_update",
                              [](const OpAttrs& a) -> OpArity {
                                const int64_t n = counted<SgdAttrs>("sgd_update", a);
                                return {{n}, {n, n}};
                              },
                              ref_of<SgdAttrs, ref::sgd>());
    d.unused_output = [](const OpAttrs& a) { return std::get<SgdAttrs>(a).momentum == 0.f ? 1 : -1; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<SgdAttrs>(a).lr = s.lr; };
    set(K::SgdUpdate, std::move(d));
  }
  {
    OpDesc d = desc<AdamAttrs>("adam_update",
                               [](const OpAttrs& attrs) -> OpArity {
                                 const int64_t n = counted<AdamAttrs>("adam_update", attrs);
                                 const auto& a = std::get<AdamAttrs>(attrs);
                                 if (a.step < 1)
                                   throw Error("op adam_update: step must be >= 1, found " + std::to_string(a.step));
                                 return {{n}, {n, n, n}};
                               },
                               ref_of<AdamAttrs, ref::adam>());
    d.step_scalars = kStepLearningRate | kStepCount;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<AdamAttrs>(attrs);
      a.lr = s.lr;
      a.step = s.step + 1;
    };
    set(K::AdamUpdate, std::move(d));
  }
  {
    OpDesc d = desc<RmspropAttrs>("rmsprop_update",
                                  [](const OpAttrs& a) -> OpArity {
                                    const int64_t n = counted<RmspropAttrs>("rmsprop_update", a);
                                    return {{n}, {n, n, n}};
                                  },
                                  ref_of<RmspropAttrs, ref::rmsprop>());
    d.unused_output = [](const OpAttrs& a) { return std::get<RmspropAttrs>(a).momentum > 0.f ? -1 : 2; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& a, const StepScalars& s) { std::get<RmspropAttrs>(a).lr = s.lr; };
    set(K::RmspropUpdate, std::move(d));
  }
  {
    OpDesc d = desc<EmaAttrs>("ema_update",
                              [](const OpAttrs& a) -> OpArity {
                                const int64_t n = counted<EmaAttrs>("ema_update", a);
                                return {{n}, {n}};
                              },
                              ref_of<EmaAttrs, ref::ema>());
    d.step_scalars = kStepCount;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<EmaAttrs>(attrs);
      if (a.warmup) a.decay = std::min(a.max_decay, static_cast<float>(1 + s.step) / static_cast<float>(10 + s.step));
    };
    set(K::EmaUpdate, std::move(d));
  }

  for (auto [k, name] : {std::pair{K::EmbeddingForward, "embedding_forward"},
                         std::pair{K::EmbeddingBackward, "embedding_backward"}}) {
    OpDesc d = desc<EmbeddingAttrs>(name, [k = k, name = name](const OpAttrs& a) { return embedding_arity(k, name, a); },
                                    ref_of<EmbeddingAttrs, ref::embedding>(k));
    d.data_inputs = {0};
    if (k == K::EmbeddingForward) d.grad = embedding_grad;
    set(k, std::move(d));
  }

  for (auto [k, name] : {std::pair{K::LayerNormForward, "layer_norm_forward"},
                         std::pair{K::LayerNormBackward, "layer_norm_backward"}}) {
    OpDesc d = desc<LayerNormAttrs>(name,
                                    [k = k, name = name](const OpAttrs& a) { return layer_norm_arity(k, name, a); },
                                    ref_of<LayerNormAttrs, ref::layer_norm>(k));
    if (k == K::LayerNormForward) {
      d.grad = layer_norm_grad;
      d.saved_outputs = {1, 2};
    }
    set(k, std::move(d));
  }
  // Gradient clipping by global norm: a sum of squares accumulated over every gradient, then one scale each.
  set(K::SumSquares, desc<ElementwiseAttrs>("sum_squares",
                                            [](const OpAttrs& a) -> OpArity {
                                              const int64_t n = counted<ElementwiseAttrs>("sum_squares", a);
                                              return {{n}, {1}};
                                            },
                                            ref_of<ElementwiseAttrs, ref::sum_squares>()));
  set(K::ClipByGlobalNorm, desc<ElementwiseAttrs>("clip_by_global_norm",
                                                  [](const OpAttrs& a) -> OpArity {
                                                    const int64_t n = counted<ElementwiseAttrs>("clip_by_global_norm", a);
                                                    return {{1}, {n}};
                                                  },
                                                  ref_of<ElementwiseAttrs, ref::clip_by_global_norm>()));
  for (auto [k, name] : {std::pair{K::BatchNormForward, "batch_norm_forward"},
                         std::pair{K::BatchNormBackward, "batch_norm_backward"}}) {
    OpDesc d = desc<BatchNormAttrs>(name,
                                    [k = k, name = name](const OpAttrs& a) { return batch_norm_arity(k, name, a); },
                                    ref_of<BatchNormAttrs, ref::batch_norm>(k));
    if (k == K::BatchNormForward) {
      d.grad = batch_norm_grad;
      d.saved_outputs = {1, 2, 3, 4};
    }
    set(k, std::move(d));
  }
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name.empty() || !t[i].arity || !t[i].reference)
      throw Error("internal: built-in op kind " + std::to_string(i) + " has no complete table entry");
  return t;
}

}  // namespace kiln::op_impl
