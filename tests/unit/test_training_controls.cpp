// [optimizer] and [train] settings and what the trainer does with them: ema_warmup's decay, every optimizer and
// schedule hyperparameter range-checked where it is written (a zero epsilon used to train to 0.09 accuracy, an infinite
// learning rate or a NaN weight decay failed only at run time, a cosine schedule without decay steps was accepted),
// and an evaluation whose loss turns non-finite stops naming the batch and the layer instead of reporting an accuracy.
// early_stopping and ema_warmup through the app: tests/integration/test_training_controls.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <optional>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/evaluation.hpp"
#include "kiln/model.hpp"
#include "kiln/op_table.hpp"
#include "kiln/strategy.hpp"
#include "test_support.hpp"

using namespace kiln;

TEST_CASE("ema_warmup patches the EMA decay to min(decay, (1 + n) / (10 + n)) each step", "[ema]") {
  const OpDesc& d = op_desc(OpKind::EmaUpdate);
  REQUIRE(d.patch);
  OpAttrs a = EmaAttrs{16, 0.999f, true, 0.999f};
  auto decay_at = [&](int64_t step) {
    StepScalars s;
    s.step = step;
    d.patch(a, s);
    return std::get<EmaAttrs>(a).decay;
  };
  CHECK(decay_at(0) == Approx(0.1f));  // (1 + 0) / (10 + 0)
  CHECK(decay_at(90) == Approx(91.f / 100.f));
  CHECK(decay_at(8990) == Approx(0.999f));  // (1 + n) / (10 + n) reaches 0.999 at n = 8990
  CHECK(decay_at(1000000) == Approx(0.999f));
  OpAttrs plain = EmaAttrs{16, 0.99f};  // without warmup the decay is left alone
  StepScalars s;
  s.step = 3;
  d.patch(plain, s);
  CHECK(std::get<EmaAttrs>(plain).decay == 0.99f);
}

namespace {

std::string error_of(const std::string& toml) {
  try {
    auto c = kiln::Config::load_string(toml, "run.toml");
    kiln::parse_optimizer(*c.root().table("optimizer"));
  } catch (const kiln::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("optimizer and schedule values out of range are config errors naming the key", "[hardening][config]") {
  struct Bad {
    const char* toml;
    const char* key;
  };
  const Bad bad[] = {
      {"[optimizer]\ntype = \"adam\"\nepsilon = 0.0\n", "epsilon"},
      {"[optimizer]\ntype = \"adam\"\nepsilon = -1e-8\n", "epsilon"},
      {"[optimizer]\ntype = \"rmsprop\"\nepsilon = nan\n", "epsilon"},
      {"[optimizer]\nlearning_rate = inf\n", "learning_rate"},
      {"[optimizer]\nlearning_rate = nan\n", "learning_rate"},
      {"[optimizer]\nweight_decay = nan\n", "weight_decay"},
      {"[optimizer]\nweight_decay = -0.1\n", "weight_decay"},
      {"[optimizer]\ntype = \"sgd\"\nmomentum = nan\n", "momentum"},
      {"[optimizer]\ntype = \"rmsprop\"\nrho = 1.0\n", "rho"},
      {"[optimizer]\n[optimizer.schedule]\ntype = \"exponential\"\ndecay_rate = -0.5\n", "decay_rate"},
      {"[optimizer]\n[optimizer.schedule]\ntype = \"step\"\ndecay_rate = inf\n", "decay_rate"},
      {"[optimizer]\n[optimizer.schedule]\ntype = \"cosine\"\ndecay_steps = 0\n", "decay_steps"},
      {"[optimizer]\n[optimizer.schedule]\ntype = \"cosine\"\ndecay_steps = 100\nalpha = 2.0\n", "alpha"},
  };
  for (const Bad& b : bad) {
    INFO(b.toml);
    const std::string m = error_of(b.toml);
    CHECK_THAT(m, Catch::Contains("run.toml") && Catch::Contains(b.key) && Catch::Contains("expected"));
  }
  // Good values still parse.
  CHECK(error_of("[optimizer]\ntype = \"adam\"\nepsilon = 1e-8\nweight_decay = 0.01\n") == "");
  CHECK(error_of("[optimizer]\n[optimizer.schedule]\ntype = \"cosine\"\ndecay_steps = 1000\nalpha = 0.1\n") == "");
  CHECK(error_of("[optimizer]\n[optimizer.schedule]\ntype = \"cosine\"\n") == "");  // the whole run
  CHECK(error_of("[optimizer]\ntype = \"rmsprop\"\nrho = 0.0\nmomentum = 0.5\n") == "");
}

namespace {

// A runner whose evaluation loss is NaN on its second batch, as weights or activations gone non-finite give.
class NanEvalRunner final : public kiln::Runner {
 public:
  kiln::StepResult train_step(const kiln::Element&, const kiln::StepScalars&) override { return {}; }
  kiln::EvalResult eval_batch(const kiln::Element& b, bool) override {
    kiln::EvalResult r;
    r.losses = {++calls_ == 2 ? std::nanf("") : 0.5f};
    r.outputs.emplace_back(kiln::Shape{b.batch, 3});  // zeros: every prediction is class 0
    return r;
  }
  std::map<std::string, kiln::HostTensor> save_state() override { return {}; }
  void load_state(const std::map<std::string, kiln::HostTensor>&) override {}
  std::string find_nonfinite_layer(const kiln::Element&, int64_t) override { return "dense_2"; }
  std::vector<kiln::DevicePlan> plan() const override { return {}; }

 private:
  int calls_ = 0;
};

class ZeroLabels final : public kiln::Stage {
 public:
  std::string name() const override { return "zeros"; }
  std::optional<kiln::Element> next() override {
    if (n_ == 3) return std::nullopt;
    ++n_;
    kiln::Element e;
    e.batch = 4;
    e.x = kiln::HostTensor(kiln::Shape{4, 2});
    e.y = kiln::HostTensor(kiln::Shape{4});
    return e;
  }
  void reset(uint64_t) override { n_ = 0; }
  kiln::Shape example_shape() const override { return kiln::Shape{2}; }
  kiln::Shape label_shape() const override { return kiln::Shape{}; }
  kiln::StageState save() const override { return {}; }
  void restore(const kiln::StageState&) override {}

 private:
  int n_ = 0;
};

}  // namespace

TEST_CASE("a non-finite loss in evaluation is an error naming the batch and layer, not an accuracy",
          "[hardening][labels]") {
  kiln::ModelSpec m;
  m.outputs.push_back({"dense_2", kiln::LossKind::softmax_cross_entropy, 1.f, true, ""});
  NanEvalRunner runner;
  ZeroLabels data;
  try {
    kiln::Evaluation e = kiln::evaluate(runner, data, m, false);
    FAIL("evaluation reported loss " << e.loss << " and accuracy " << e.accuracy << " over a NaN loss");
  } catch (const kiln::NumericError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("evaluation stopped") && Catch::Contains("output 'dense_2'") &&
                        Catch::Contains("nan") && Catch::Contains("evaluation batch 2") &&
                        Catch::Contains("examples 4 to 7") &&
                        Catch::Contains("first layer whose output is non-finite is 'dense_2'"));
  }
}
