// The [optimizer] table and its learning-rate schedules.
#include <cmath>
#include <cstdint>
#include <string>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"

namespace kiln {

namespace {
// Every hyperparameter is checked where it is written: NaN and infinities fail these comparisons too.
void require(const ConfigNode& c, const char* key, bool ok, const char* expected) {
  if (!ok) c.fail(key, expected);
}
}  // namespace

OptimizerSpec parse_optimizer(const ConfigNode& c) {
  OptimizerSpec o;
  auto type = c.get_choice("type", {"sgd", "adam", "adamw", "rmsprop"}, "adam");
  o.kind = type == "sgd"     ? OptimizerKind::sgd
           : type == "adam"  ? OptimizerKind::adam
           : type == "adamw" ? OptimizerKind::adamw
                             : OptimizerKind::rmsprop;
  const bool adamw = o.kind == OptimizerKind::adamw;
  o.lr = c.get_float("learning_rate", type == "sgd" ? 0.01 : 0.001);
  require(c, "learning_rate", o.lr > 0 && std::isfinite(o.lr), "expected a positive, finite number");
  // AdamW's defaults are PyTorch's (weight_decay 0.01, epsilon 1e-8); its decay is decoupled from the gradient.
  o.weight_decay = c.get_float("weight_decay", adamw ? 0.01 : 0.0);
  require(c, "weight_decay", o.weight_decay >= 0 && std::isfinite(o.weight_decay),
          "expected a non-negative, finite number (0 turns weight decay off)");
  o.decay_params =
      c.get_choice("decay_params", {"all", "matrices"}, "all") == "all" ? DecayParams::all : DecayParams::matrices;
  if (o.kind == OptimizerKind::sgd) {
    o.momentum = c.get_float("momentum", 0.0);
    o.nesterov = c.get_bool("nesterov", false);
    if (o.nesterov && o.momentum <= 0) c.fail("nesterov", "Nesterov momentum needs momentum > 0");
  } else if (o.kind == OptimizerKind::adam || adamw) {
    o.beta1 = c.get_float("beta1", 0.9);
    o.beta2 = c.get_float("beta2", 0.999);
    o.eps = c.get_float("epsilon", adamw ? 1e-8 : 1e-7);
    if (!(o.beta1 >= 0 && o.beta1 < 1)) c.fail("beta1", "expected a number in [0, 1)");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) c.fail("beta2", "expected a number in [0, 1)");
    require(c, "epsilon", o.eps > 0 && std::isfinite(o.eps), "expected a positive, finite number, e.g. 1e-7");
  } else {
    o.rho = c.get_float("rho", 0.9);
    o.eps = c.get_float("epsilon", 1e-7);
    o.momentum = c.get_float("momentum", 0.0);
    require(c, "rho", o.rho >= 0 && o.rho < 1, "expected a number in [0, 1)");
    require(c, "epsilon", o.eps > 0 && std::isfinite(o.eps), "expected a positive, finite number, e.g. 1e-7");
  }
  require(c, "momentum", o.momentum >= 0 && o.momentum < 1, "expected a number in [0, 1)");
  o.ema_decay = c.get_float("ema", 0.0);
  if (!(o.ema_decay >= 0 && o.ema_decay < 1)) c.fail("ema", "expected a decay in [0, 1), e.g. 0.999 (0 turns EMA off)");
  o.ema_warmup = c.get_bool("ema_warmup", false);
  if (o.ema_warmup && o.ema_decay == 0)
    c.fail("ema_warmup", "is true but ema is off (set [optimizer] ema, e.g. 0.999)");
  o.clip_norm = c.get_float("clip_norm", 0.0);
  require(c, "clip_norm", o.clip_norm >= 0 && std::isfinite(o.clip_norm),
          "expected a non-negative, finite maximum gradient norm, e.g. 1.0 (0 turns clipping off)");
  if (auto s = c.table("schedule")) {
    auto k = s->get_choice("type", {"constant", "exponential", "step", "cosine"}, "constant");
    o.schedule.kind = k == "constant"      ? ScheduleKind::constant
                      : k == "exponential" ? ScheduleKind::exponential
                      : k == "step"        ? ScheduleKind::step
                                           : ScheduleKind::cosine;
    if (o.schedule.kind == ScheduleKind::exponential || o.schedule.kind == ScheduleKind::step) {
      o.schedule.decay_rate = s->get_float("decay_rate", o.schedule.kind == ScheduleKind::step ? 0.1 : 0.96);
      o.schedule.decay_steps = s->get_int("decay_steps", 1000);
      if (o.schedule.decay_steps <= 0) s->fail("decay_steps", "expected a positive integer");
      require(*s, "decay_rate", o.schedule.decay_rate > 0 && std::isfinite(o.schedule.decay_rate),
              "expected a positive, finite number (below 1 decays the learning rate)");
      if (o.schedule.kind == ScheduleKind::exponential) o.schedule.staircase = s->get_bool("staircase", false);
    } else if (o.schedule.kind == ScheduleKind::cosine) {
      // Omitted: the whole run (the trainer fills it in once the epoch length is known).
      const bool given = s->has("decay_steps");
      o.schedule.total_steps = s->get_int("decay_steps", 0);
      require(*s, "decay_steps", !given || o.schedule.total_steps > 0,
              "expected a positive integer: the steps over which the cosine decays (omit it for the whole run)");
      o.schedule.alpha = s->get_float("alpha", 0.0);
      require(*s, "alpha", o.schedule.alpha >= 0 && o.schedule.alpha <= 1,
              "expected a number in [0, 1]: the final fraction of the learning rate");
      if (s->has("min_learning_rate")) {
        if (s->has("alpha"))
          s->fail("min_learning_rate",
                  "give the cosine's floor once: min_learning_rate (absolute) or alpha (a fraction)");
        o.schedule.min_lr = s->get_float("min_learning_rate", 0.0);
        require(*s, "min_learning_rate", o.schedule.min_lr >= 0 && o.schedule.min_lr <= o.lr,
                "expected a number in [0, learning_rate]: the learning rate the cosine ends at");
      }
    }
    o.schedule.warmup_steps = s->get_int("warmup_steps", 0);
    require(*s, "warmup_steps", o.schedule.warmup_steps >= 0 && o.schedule.warmup_steps < (int64_t{1} << 40),
            "expected a non-negative number of steps (0: no warmup)");
    s->finish();
  }
  c.finish();
  return o;
}

double OptimizerSpec::learning_rate_at(int64_t step) const {
  const auto& s = schedule;
  // nanoGPT's warmup: lr * (it + 1) / (warmup_iters + 1); the schedule then counts steps from its end.
  if (step < s.warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps + 1);
  step -= s.warmup_steps;
  switch (s.kind) {
    case ScheduleKind::constant:
      return lr;
    case ScheduleKind::exponential: {
      double p = static_cast<double>(step) / static_cast<double>(s.decay_steps);
      if (s.staircase) p = std::floor(p);
      return lr * std::pow(s.decay_rate, p);
    }
    case ScheduleKind::step:
      return lr * std::pow(s.decay_rate, static_cast<double>(step / s.decay_steps));
    case ScheduleKind::cosine: {
      if (s.total_steps <= 0) return lr;
      double t = std::min<double>(static_cast<double>(step), static_cast<double>(s.total_steps)) /
                 static_cast<double>(s.total_steps);
      const double floor = s.min_lr >= 0 ? s.min_lr : s.alpha * lr;
      return floor + (lr - floor) * 0.5 * (1 + std::cos(M_PI * t));
    }
  }
  return lr;
}

size_t OptimizerSpec::state_tensors_per_param() const {
  switch (kind) {
    case OptimizerKind::sgd:
      return momentum > 0 ? 1 : 0;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return 2;
    case OptimizerKind::rmsprop:
      return momentum > 0 ? 2 : 1;
  }
  return 0;
}

}  // namespace kiln
