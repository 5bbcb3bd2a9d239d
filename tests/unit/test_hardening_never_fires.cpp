// Issue 15 item 12: settings that can never take effect are refused where they are written: a fault injection
// block request the run never makes, and a layer of a DAG model whose output nothing uses.
#include <catch2/catch.hpp>
#include <sstream>

#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/session.hpp"
#include "kiln/trainer.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

// dense 4 -> 2 (2 parameters), Adam (2 state tensors each): 6 persistent tensors.
const std::string kModel = "[model]\ninput_shape = [4]\n[[model.layers]]\nname = \"fc\"\ntype = \"dense\"\nunits = 2\n";

std::string config_error(const std::string& toml) {
  try {
    Session s(Config::load_string(toml, "run.toml"), test::registry());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<ok>";
}

}  // namespace

TEST_CASE("fault_injection_block beyond the single reservation of growth = false is refused", "[hardening][fault_injection]") {
  const std::string m = config_error("[device]\ngrowth = false\nfault_injection_block = 2\n" + kModel);
  CHECK_THAT(m, Catch::Contains("run.toml:3: key 'device.fault_injection_block'") && Catch::Contains("is 2") &&
                    Catch::Contains("growth = false") && Catch::Contains("1 block request") &&
                    Catch::Contains("#2 never happens"));
  CHECK(config_error("[device]\ngrowth = false\nfault_injection_block = 1\n" + kModel) == "<ok>");
  CHECK(config_error("[device]\ngrowth = false\nfault_injection_block = 0\n" + kModel) == "<ok>");
}

TEST_CASE("fault_injection_block beyond the block requests a growing run can make is refused, naming the count",
          "[hardening][fault_injection]") {
  // 2 x 30 planned reservations + 4 x (6 persistent tensors + 4 regions x 30 step graphs) = 564.
  const std::string m = config_error("[device]\nfault_injection_block = 565\n" + kModel);
  CHECK_THAT(m, Catch::Contains("run.toml:2: key 'device.fault_injection_block'") && Catch::Contains("is 565") &&
                    Catch::Contains("at most 564 block requests") && Catch::Contains("6 persistent tensors") &&
                    Catch::Contains("1 to 564"));
  CHECK(config_error("[device]\nfault_injection_block = 564\n" + kModel) == "<ok>");
  CHECK_THAT(config_error("[device]\nfault_injection_block = 1000000\n" + kModel), Catch::Contains("at most 564"));
}

TEST_CASE("a training run makes no more block requests than the bound fault_injection_block is checked against",
          "[hardening][fault_injection]") {
  auto dir = test::temp_dir("never-fires-count");
  std::ostringstream toml;
  toml << "[device]\nbackend = \"cpu\"\nmemory_limit = \"64MiB\"\nfault_injection_block = 564\n" << kModel
       << "[train]\nepochs = 2\nbatch_size = 3\nprogress = \"none\"\noutput_dir = \"" << (dir / "out").string() << "\"\n"
       << "[data.train]\nstages = [{type = \"synthetic\", shape = [4], classes = 2, examples = 10}]\n"
       << "[data.test]\nstages = [{type = \"synthetic\", shape = [4], classes = 2, examples = 7}]\n";
  Session s(Config::load_string(toml.str(), (dir / "run.toml").string()), test::registry());
  std::ostringstream out;
  Trainer(s, out).run();
  INFO(out.str());
  REQUIRE(s.devices().size() == 1);
  const size_t made = s.devices()[0].allocator->stats().block_requests;
  CHECK(made >= 1);
  CHECK(made < 564);
}

TEST_CASE("a DAG layer whose output nothing uses is a config error naming the layer and its line", "[hardening][dag]") {
  const std::string dag =
      "[model]\ninput_shape = [4]\n"          // lines 1-2
      "[[model.layers]]\nname = \"a\"\ntype = \"dense\"\nunits = 3\n"  // lines 3-6
      "[[model.layers]]\nname = \"b\"\ntype = \"dense\"\nunits = 3\ninputs = [\"input\"]\n"  // lines 7-11
      "[[model.layers]]\nname = \"out\"\ntype = \"dense\"\nunits = 2\ninputs = [\"b\"]\n";  // lines 12-16
  const std::string m = config_error(dag);
  CHECK_THAT(m, Catch::Contains("run.toml:3: key 'model.layers[0]'") && Catch::Contains("layer \"a\" (type dense)") &&
                    Catch::Contains("nothing uses its output") && Catch::Contains("the last layer, \"out\""));
  // Used by a later layer, or listed as an output: fine.
  CHECK(config_error(dag + "[[model.layers]]\nname = \"join\"\ntype = \"concat\"\ninputs = [\"a\", \"out\"]\n") == "<ok>");
  CHECK(config_error("[model]\ninput_shape = [4]\n"
                     "[[model.layers]]\nname = \"a\"\ntype = \"dense\"\nunits = 2\n"
                     "[[model.layers]]\nname = \"b\"\ntype = \"dense\"\nunits = 2\ninputs = [\"input\"]\n"
                     "[[model.layers]]\nname = \"sum\"\ntype = \"add\"\ninputs = [\"a\", \"b\"]\n") == "<ok>");
  // With [[model.outputs]], an output that no layer reads is used.
  const std::string heads = "[model]\ninput_shape = [4]\n"
                            "[[model.layers]]\nname = \"trunk\"\ntype = \"dense\"\nunits = 3\n"
                            "[[model.layers]]\nname = \"h1\"\ntype = \"dense\"\nunits = 2\ninputs = [\"trunk\"]\n"
                            "[[model.layers]]\nname = \"h2\"\ntype = \"dense\"\nunits = 2\ninputs = [\"trunk\"]\n";
  CHECK(config_error(heads + "[[model.outputs]]\nlayer = \"h1\"\n[[model.outputs]]\nlayer = \"h2\"\nloss = \"mse\"\n") == "<ok>");
  const std::string one = config_error(heads + "[[model.outputs]]\nlayer = \"h2\"\n");
  CHECK_THAT(one, Catch::Contains("run.toml:7: key 'model.layers[1]'") && Catch::Contains("layer \"h1\"") &&
                      Catch::Contains("nothing uses its output") && Catch::Contains("[[model.outputs]]"));
}
