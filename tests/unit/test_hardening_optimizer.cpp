// Issue 15 item 7: every optimizer and schedule hyperparameter is range-checked where it is written, naming
// the file, the key and what was expected (a zero epsilon used to train to 0.09 accuracy, an infinite learning
// rate or a NaN weight decay failed only at run time, a cosine schedule without decay steps was accepted).
#include <catch2/catch.hpp>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"

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
