// The optimizer updates: SGD (momentum, Nesterov, weight decay), Adam (L2 or decoupled decay), RMSprop and the
// exponential moving average of weights. They read per-step scalars (learning rate, step count) that the executor
// patches into the attributes before every step. Semantics: ops.hpp.
#include <algorithm>
#include <cmath>

#include "kiln/step.hpp"
#include "op_support.hpp"

namespace kiln::op_impl {
namespace {

void sgd_ref(const SgdAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* v = out[1];
  for (int64_t i = 0; i < a.count; ++i) {
    const double gp = double(g[i]) + double(a.weight_decay) * w[i];
    double d = gp;
    if (a.momentum != 0.f) {
      const double vn = double(a.momentum) * v[i] + gp;
      v[i] = static_cast<float>(vn);
      d = a.nesterov ? gp + double(a.momentum) * vn : vn;
    }
    w[i] = static_cast<float>(w[i] - double(a.lr) * d);
  }
}

void adam_ref(const AdamAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* m = out[1];
  float* v = out[2];
  const double b1 = a.beta1, b2 = a.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(a.step)), bc2 = 1.0 - std::pow(b2, double(a.step));
  const double keep = 1.0 - double(a.lr) * double(a.decoupled_decay);
  for (int64_t i = 0; i < a.count; ++i) {
    if (a.decoupled_decay != 0.f) w[i] = static_cast<float>(w[i] * keep);
    const double gp = double(g[i]) + double(a.weight_decay) * w[i];
    const double mn = b1 * m[i] + (1.0 - b1) * gp;
    const double vn = b2 * v[i] + (1.0 - b2) * gp * gp;
    m[i] = static_cast<float>(mn);
    v[i] = static_cast<float>(vn);
    w[i] = static_cast<float>(w[i] - double(a.lr) * (mn / bc1) / (std::sqrt(vn / bc2) + double(a.eps)));
  }
}

void rmsprop_ref(const RmspropAttrs& a, In in, Out out) {
  const float* g = in[0];
  float* w = out[0];
  float* sq = out[1];
  float* buf = out[2];
  const double rho = a.rho;
  for (int64_t i = 0; i < a.count; ++i) {
    const double gi = g[i];
    const double sn = rho * sq[i] + (1.0 - rho) * gi * gi;
    sq[i] = static_cast<float>(sn);
    const double step = gi / (std::sqrt(sn) + double(a.eps));
    if (a.momentum > 0.f) {
      const double bn = double(a.momentum) * buf[i] + step;
      buf[i] = static_cast<float>(bn);
      w[i] = static_cast<float>(w[i] - double(a.lr) * bn);
    } else {
      w[i] = static_cast<float>(w[i] - double(a.lr) * step);
    }
  }
}

void ema_ref(const EmaAttrs& a, In in, Out out) {
  const double d = a.decay;
  for (int64_t i = 0; i < a.count; ++i) out[0][i] = static_cast<float>(d * out[0][i] + (1.0 - d) * in[0][i]);
}

void optimizer_cases(Table& t) {
  const int64_t sizes[] = {1, 257, 10007};
  const Gen pos = uni(0.f, 0.01f);  // second-moment state is never negative
  for (int64_t s : sizes) {
    const std::string v = str(s);
    t.add(v + ".plain", OpKind::SgdUpdate, SgdAttrs{s, 0.1f, 0.f, 0.f, false}, {kF}, {kF, kF}, Check::elementwise,
          false);
    t.add(v + ".momentum", OpKind::SgdUpdate, SgdAttrs{s, 0.05f, 0.9f, 0.f, false}, {kF}, {kF, kF}, Check::elementwise,
          false);
    t.add(v + ".nesterov.wd", OpKind::SgdUpdate, SgdAttrs{s, 0.05f, 0.9f, 0.01f, true}, {kF}, {kF, kF},
          Check::elementwise, false);
    t.add(v + ".step1", OpKind::AdamUpdate, AdamAttrs{s, 1e-3f, 0.9f, 0.999f, 1e-7f, 0.f, 1}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".step10.wd", OpKind::AdamUpdate, AdamAttrs{s, 1e-2f, 0.8f, 0.99f, 1e-8f, 0.01f, 10}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".step10.adamw", OpKind::AdamUpdate, AdamAttrs{s, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.f, 10, 0.1f}, {kF},
          {kF, uni(-0.1f, 0.1f), pos}, Check::elementwise, false);
    t.add(v + ".plain", OpKind::RmspropUpdate, RmspropAttrs{s, 1e-2f, 0.9f, 1e-7f, 0.f}, {kF}, {kF, pos, kF},
          Check::elementwise, false);
    t.add(v + ".momentum", OpKind::RmspropUpdate, RmspropAttrs{s, 1e-2f, 0.9f, 1e-7f, 0.9f}, {kF}, {kF, pos, kF},
          Check::elementwise, false);
    t.add(v + ".decay0.999", OpKind::EmaUpdate, EmaAttrs{s, 0.999f}, {kF}, {kF}, Check::elementwise, false);
    t.add(v + ".decay0.5.int", OpKind::EmaUpdate, EmaAttrs{s, 0.5f}, {kI}, {kI}, Check::elementwise, true);
  }
}

}  // namespace

KILN_CORE_OPS(optimizer) {
  {
    OpDesc d = desc<SgdAttrs>(
        "sgd_update",
        [](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<SgdAttrs>("sgd_update", a);
          return {{n}, {n, n}};
        },
        ref_of<SgdAttrs, sgd_ref>());
    d.unused_output = [](const OpAttrs& a) { return std::get<SgdAttrs>(a).momentum == 0.f ? 1 : -1; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<SgdAttrs>(attrs);
      a.lr = s.lr * a.lr_scale;
    };
    d.cases = cases_of(OpKind::SgdUpdate, optimizer_cases);
    register_op(OpKind::SgdUpdate, std::move(d));
  }
  {
    OpDesc d = desc<AdamAttrs>(
        "adam_update",
        [](const OpAttrs& attrs) -> OpArity {
          const int64_t n = counted<AdamAttrs>("adam_update", attrs);
          const auto& a = std::get<AdamAttrs>(attrs);
          if (a.step < 1) throw Error("op adam_update: step must be >= 1, found " + std::to_string(a.step));
          return {{n}, {n, n, n}};
        },
        ref_of<AdamAttrs, adam_ref>());
    d.step_scalars = kStepLearningRate | kStepCount;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<AdamAttrs>(attrs);
      a.lr = s.lr * a.lr_scale;
      a.step = s.step + 1;
    };
    d.cases = cases_of(OpKind::AdamUpdate, optimizer_cases);
    register_op(OpKind::AdamUpdate, std::move(d));
  }
  {
    OpDesc d = desc<RmspropAttrs>(
        "rmsprop_update",
        [](const OpAttrs& a) -> OpArity {
          const int64_t n = counted<RmspropAttrs>("rmsprop_update", a);
          return {{n}, {n, n, n}};
        },
        ref_of<RmspropAttrs, rmsprop_ref>());
    d.unused_output = [](const OpAttrs& a) { return std::get<RmspropAttrs>(a).momentum > 0.f ? -1 : 2; };
    d.step_scalars = kStepLearningRate;
    d.patch = [](OpAttrs& attrs, const StepScalars& s) {
      auto& a = std::get<RmspropAttrs>(attrs);
      a.lr = s.lr * a.lr_scale;
    };
    d.cases = cases_of(OpKind::RmspropUpdate, optimizer_cases);
    register_op(OpKind::RmspropUpdate, std::move(d));
  }
  OpDesc d = desc<EmaAttrs>(
      "ema_update",
      [](const OpAttrs& a) -> OpArity {
        const int64_t n = counted<EmaAttrs>("ema_update", a);
        return {{n}, {n}};
      },
      ref_of<EmaAttrs, ema_ref>());
  d.step_scalars = kStepCount;
  d.patch = [](OpAttrs& attrs, const StepScalars& s) {
    auto& a = std::get<EmaAttrs>(attrs);
    if (a.warmup) a.decay = std::min(a.max_decay, static_cast<float>(1 + s.step) / static_cast<float>(10 + s.step));
  };
  d.cases = cases_of(OpKind::EmaUpdate, optimizer_cases);
  register_op(OpKind::EmaUpdate, std::move(d));
}

}  // namespace kiln::op_impl
