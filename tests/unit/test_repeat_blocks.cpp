// Repeated blocks ([[model.layers]] repeat = N with [[model.layers.block]] tables): the expansion is the model
// written out by hand (samples/shakespeare_char.toml against tests/fixtures/shakespeare_char_unrolled.toml: names,
// shapes, parameters, ops, and the first training steps' losses and weights bit for bit), and every mistake in a
// block is a config error naming the file, the line, the key and the repetition.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "kiln/allocator.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/model.hpp"
#include "kiln/strategy.hpp"
#include "test_support.hpp"

using namespace kiln;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kSample = std::string(KILN_SOURCE_DIR) + "/samples/shakespeare_char.toml";
const std::string kUnrolled = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/shakespeare_char_unrolled.toml";

ModelSpec text_model(const std::string& path) {
  ModelSpec m = test::model_from(read_text(path), 1337);
  m.label_shape = Shape{64};  // the text source's next-character ids
  return m;
}

OptimizerSpec optimizer_of(const std::string& path) {
  auto c = Config::load_string(read_text(path), path);
  return parse_optimizer(*c.root().table("optimizer"));
}

std::unique_ptr<Runner> single_runner(const ModelSpec& m, const OptimizerSpec& o, Device& dev, Allocator& alloc,
                                      int64_t batch) {
  auto cfg = Config::load_string("[strategy]\ntype = \"single\"\n", "strategy.toml");
  auto table = cfg.root().table("strategy");
  auto strategy = test::registry().strategy(table->get_string("type"))(*table);
  RunnerContext c;
  c.model = &m;
  c.optimizer = &o;
  c.devices = {{&dev, &alloc}};
  c.global_batch = batch;
  c.seed = 1337;
  return strategy->create(c);
}

// Windows of 64 character ids and their next characters, from `seed`.
Element char_batch(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Element e;
  e.batch = n;
  e.x = HostTensor(Shape{n, 64});
  e.y = HostTensor(Shape{n, 64});
  for (auto& v : e.x.data) v = float(rng() % 65);
  for (auto& v : e.y.data) v = float(rng() % 65);
  return e;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The error parse_model gives for `layers` (the [[model.layers]] tables of a model with input_shape [8]).
std::string model_error(const std::string& layers) {
  try {
    test::model_from("[model]\ninput_shape = [8]\nloss = \"mse\"\n" + layers);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Three dense layers of 8 units, as a block repeated `repeat` times, with `extra` added to the block's first table.
std::string dense_block(const std::string& repeat, const std::string& name = "d{i}", const std::string& extra = "") {
  return "[[model.layers]]\nrepeat = " + repeat + "\n[[model.layers.block]]\nname = \"" + name +
         "\"\ntype = \"dense\"\nunits = 8\n" + extra;
}

}  // namespace

TEST_CASE("a repeated block expands into the layers written out by hand: names, inputs, parameters and ops",
          "[repeat]") {
  const ModelSpec a = text_model(kSample), b = text_model(kUnrolled);
  REQUIRE(a.layers.size() == b.layers.size());
  REQUIRE(a.layers.size() == 2 + 4 * 7 + 2);
  for (size_t i = 0; i < a.layers.size(); ++i) {
    INFO("layer " << i << ": " << b.layers[i].name);
    CHECK(a.layers[i].name == b.layers[i].name);
    CHECK(a.layers[i].type == b.layers[i].type);
    CHECK(a.layers[i].inputs == b.layers[i].inputs);
    CHECK(a.layers[i].block.empty() == (i < 2 || i >= 30));
  }
  CHECK(a.layers[9].name == "h1_ln_1");
  CHECK(a.layers[9].inputs == std::vector<std::string>{"h0_res_2"});        // {prev} after the first repetition
  CHECK(a.layers[4].inputs == std::vector<std::string>{"wpe", "h0_attn"});  // {prev} at i = 0: the block's input
  CHECK(a.layers[30].inputs == std::vector<std::string>{"h3_res_2"});       // after the block: its last layer
  const OptimizerSpec o = optimizer_of(kSample);
  GraphOptions go;
  go.batch = 2;
  go.optimizer = &o;
  const Graph ga = build_graph(a, go), gb = build_graph(b, go);
  REQUIRE(ga.tensors().size() == gb.tensors().size());
  int64_t params = 0;
  for (size_t t = 0; t < ga.tensors().size(); ++t) {
    const auto &x = ga.tensors()[t], &y = gb.tensors()[t];
    INFO("tensor " << t << " " << y.name);
    CHECK(x.name == y.name);
    CHECK(x.shape == y.shape);
    CHECK(x.role == y.role);
    CHECK(x.init.kind == y.init.kind);
    CHECK(x.init.value == y.init.value);
    if (x.role == TensorRole::parameter && x.alias_of == kNoTensor) params += x.shape.numel();
  }
  CHECK(params == 804096);  // kiln plan's total for the sample
  REQUIRE(ga.nodes().size() == gb.nodes().size());
  for (size_t n = 0; n < ga.nodes().size(); ++n) {
    CHECK(ga.nodes()[n].kind == gb.nodes()[n].kind);
    CHECK(ga.nodes()[n].in == gb.nodes()[n].in);
    CHECK(ga.nodes()[n].out == gb.nodes()[n].out);
    CHECK(ga.nodes()[n].layer == gb.nodes()[n].layer);
  }
}

TEST_CASE("the repeated-block sample trains bit for bit as its hand-written form: losses and weights", "[repeat]") {
  auto backend = test::registry().backend("cpu")(BackendOptions::parse("threads = 1"));
  auto dev = backend->open(0);
  AllocatorOptions ao;
  ao.limit = 1ull << 30;
  Allocator alloc(*dev, ao);
  const ModelSpec a = text_model(kSample), b = text_model(kUnrolled);
  const OptimizerSpec o = optimizer_of(kSample);
  auto ra = single_runner(a, o, *dev, alloc, 2);
  auto rb = single_runner(b, o, *dev, alloc, 2);
  for (int64_t step = 0; step < 3; ++step) {
    const Element e = char_batch(2, 100 + uint32_t(step));
    const StepScalars s{step, static_cast<float>(o.learning_rate_at(step))};
    const StepResult x = ra->train_step(e, s), y = rb->train_step(e, s);
    INFO("step " << step << ": " << x.total_loss << " against " << y.total_loss);
    CHECK(std::memcmp(&x.total_loss, &y.total_loss, sizeof(float)) == 0);
    CHECK(same_bits(x.losses, y.losses));
    CHECK(x.grad_norm == y.grad_norm);
    if (step == 0) CHECK(std::fabs(x.total_loss - std::log(65.f)) < 0.1f);  // near uniform at the start
  }
  const auto sa = ra->save_state(), sb = rb->save_state();
  REQUIRE(sa.size() == sb.size());
  for (const auto& [name, t] : sb) {
    INFO(name);
    REQUIRE(sa.count(name) == 1);
    CHECK(same_bits(sa.at(name).data, t.data));
  }
}

TEST_CASE("mistakes in a repeated block are config errors naming the file, line, key and repetition",
          "[repeat][config]") {
  // A good block first: three repetitions, each reading the one before.
  const ModelSpec m = test::model_from("[model]\ninput_shape = [8]\nloss = \"mse\"\n" + dense_block("3"));
  REQUIRE(m.layers.size() == 3);
  CHECK(m.layers[2].name == "d2");
  CHECK(m.layers[2].inputs == std::vector<std::string>{"d1"});
  CHECK(m.layers[2].block == "repetition i = 2 of the block repeated at model.toml:4 (model.layers[0], repeat = 3)");

  // Bad counts.
  CHECK_THAT(model_error(dense_block("0")),
             Catch::Contains("model.toml:5: key 'model.layers[0].repeat'") && Catch::Contains("1 to 65536, found 0"));
  CHECK_THAT(model_error(dense_block("70000")), Catch::Contains("key 'model.layers[0].repeat'"));
  CHECK_THAT(model_error(dense_block("\"four\"")),
             Catch::Contains("key 'model.layers[0].repeat'") && Catch::Contains("expected an integer"));
  CHECK_THAT(model_error("[[model.layers]]\n[[model.layers.block]]\nname = \"d{i}\"\ntype = \"dense\"\nunits = 8\n"),
             Catch::Contains("key 'model.layers[0].block'") && Catch::Contains("no repeat"));
  CHECK_THAT(model_error("[[model.layers]]\nrepeat = 2\n"),
             Catch::Contains("key 'model.layers[0].block'") && Catch::Contains("[[model.layers.block]]"));
  CHECK_THAT(model_error("[[model.layers]]\nrepeat = 2\ntype = \"dense\"\n"),
             Catch::Contains("key 'model.layers[0].type'") && Catch::Contains("takes no type"));

  // An undefined placeholder, an unclosed one, one before the first repetition: the block table's line and key,
  // and which repetition.
  const std::string undefined = model_error(dense_block("2", "d{j}"));
  CHECK_THAT(undefined, Catch::Contains("model.toml:7: key 'model.layers[0].block[0].name'") &&
                            Catch::Contains("{j}") && Catch::Contains("{i}") && Catch::Contains("{prev}") &&
                            Catch::Contains("[repetition i = 0 of the block repeated at model.toml:4"));
  CHECK_THAT(model_error(dense_block("2", "d{i")),
             Catch::Contains("key 'model.layers[0].block[0].name'") && Catch::Contains("never closed"));
  CHECK_THAT(model_error(dense_block("2", "d{i}", "inputs = [\"d{i-1}\"]\n")),
             Catch::Contains("key 'model.layers[0].block[0].inputs'") && Catch::Contains("{i-1} is -1 at i = 0") &&
                 Catch::Contains("repetition i = 0"));

  // A name without {i} clashes at the second repetition.
  CHECK_THAT(model_error(dense_block("2", "d")),
             Catch::Contains("model.toml:7: key 'model.layers[0].block[0].name'") &&
                 Catch::Contains("duplicate layer name \"d\"") && Catch::Contains("first made by repetition i = 0") &&
                 Catch::Contains("needs {i} in its name") && Catch::Contains("[repetition i = 1 of the block"));
  // A block name that clashes with a layer written before it.
  CHECK_THAT(model_error("[[model.layers]]\nname = \"d1\"\ntype = \"dense\"\nunits = 8\n" + dense_block("2")),
             Catch::Contains("duplicate layer name \"d1\"") && Catch::Contains("[repetition i = 1"));
  // A layer key the layer rejects, seen in the first repetition.
  CHECK_THAT(
      model_error(dense_block("2", "d{i}", "unitz = 3\n")),
      Catch::Contains("model.toml:10: key 'model.layers[0].block[0].unitz'") && Catch::Contains("[repetition i = 0"));
  // A reference to a later repetition.
  CHECK_THAT(model_error(dense_block("2", "d{i}", "inputs = [\"d{i+1}\"]\n")),
             Catch::Contains("\"d1\" is not an earlier layer") && Catch::Contains("repetition i = 0"));
  // Nested blocks and a block input that is no layer.
  CHECK_THAT(model_error(dense_block("2", "d{i}", "repeat = 2\n")),
             Catch::Contains("key 'model.layers[0].block[0].repeat'") && Catch::Contains("not supported"));
  CHECK_THAT(model_error("[[model.layers]]\nrepeat = 2\ninputs = [\"nope\"]\n[[model.layers.block]]\nname = "
                         "\"d{i}\"\ntype = \"dense\"\nunits = 8\n"),
             Catch::Contains("key 'model.layers[0].inputs'") && Catch::Contains("\"nope\""));
  // An error found while the graph builds (a shape) names the block table and the repetition too.
  ModelSpec bad = test::model_from(
      "[model]\ninput_shape = [4, 8]\nloss = \"mse\"\n[[model.layers]]\nrepeat = 2\n[[model.layers.block]]\nname = "
      "\"a{i}\"\ntype = \"attention\"\nheads = 3\n");
  GraphOptions go;
  go.batch = 2;
  go.training = false;
  CHECK_THROWS_WITH(build_graph(bad, go), Catch::Contains("model.layers[0].block[0]") &&
                                              Catch::Contains("layer 'a0'") && Catch::Contains("[repetition i = 0"));
}

TEST_CASE("a repeated block's input, {prev}, {i+K} and its trainable and learning_rate_scale defaults", "[repeat]") {
  const ModelSpec m = test::model_from(
      "[model]\ninput_shape = [8]\nloss = \"mse\"\n"
      "[[model.layers]]\nname = \"stem\"\ntype = \"dense\"\nunits = 8\n"
      "[[model.layers]]\nname = \"side\"\ntype = \"dense\"\nunits = 8\ninputs = [\"input\"]\n"
      "[[model.layers]]\nrepeat = 3\ninputs = [\"stem\"]\ntrainable = false\n"
      "[[model.layers.block]]\nname = \"b{i+10}_fc\"\ntype = \"dense\"\nunits = 8\n"
      "[[model.layers.block]]\nname = \"b{i+10}_sum\"\ntype = \"add\"\ninputs = [\"{prev}\", \"b{i+10}_fc\"]\n"
      "trainable = true\nlearning_rate_scale = 0.5\n"
      "[[model.layers]]\nname = \"out\"\ntype = \"add\"\ninputs = [\"b12_sum\", \"side\"]\n");
  REQUIRE(m.layers.size() == 2 + 3 * 2 + 1);
  CHECK(m.layers[2].name == "b10_fc");
  CHECK(m.layers[2].inputs == std::vector<std::string>{"stem"});  // the block's inputs, not the layer before it
  CHECK(m.layers[3].inputs == std::vector<std::string>{"stem", "b10_fc"});
  CHECK(m.layers[4].name == "b11_fc");
  CHECK(m.layers[4].inputs == std::vector<std::string>{"b10_sum"});
  CHECK(m.layers[5].inputs == std::vector<std::string>{"b10_sum", "b11_fc"});
  CHECK_FALSE(m.layers[4].trainable);  // the block's default
  CHECK(m.layers[4].lr_scale == 1.f);
  CHECK(m.layers[5].trainable);  // the layer's own key wins
  CHECK(m.layers[5].lr_scale == 0.5f);
  CHECK(m.layers[8].inputs == std::vector<std::string>{"b12_sum", "side"});
  // Outside a block braces are plain text.
  CHECK_THAT(model_error("[[model.layers]]\nname = \"d{i}\"\ntype = \"dense\"\nunits = 8\n"
                         "[[model.layers]]\nname = \"e\"\ntype = \"dense\"\nunits = 8\ninputs = [\"d{j}\"]\n"),
             Catch::Contains("\"d{j}\" is not an earlier layer"));
}
