// Hardening (issue 15): sizes near 2^63 (units, filters, batch_size, input_shape) and memory limits at or above
// 2^64 bytes are config errors naming the key, never an overflowed plan that "fits" or a limit that silently
// becomes the whole device.
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <sstream>

#include "kiln/allocator.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/graph.hpp"
#include "kiln/model.hpp"
#include "test_data_support.hpp"
#include "test_support.hpp"

using kiln::ConfigError;
using kiln::Shape;

namespace {

constexpr int64_t kHuge = int64_t{1} << 62;

std::string dense_model(const std::string& units, const std::string& input = "[784]") {
  return "[model]\ninput_shape = " + input + "\n[[model.layers]]\ntype = \"dense\"\nunits = " + units + "\n";
}

kiln::Graph build(const kiln::ModelSpec& m, int64_t batch) {
  kiln::GraphOptions o;
  o.batch = batch;
  o.training = false;
  return kiln::build_graph(m, o);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST_CASE("Shape::numel refuses an element count that overflows 64 bits, and fits() bounds a tensor's bytes",
          "[hardening][sizes]") {
  CHECK(Shape{1 << 20, 1 << 20}.numel() == int64_t{1} << 40);
  CHECK_THROWS_AS(Shape({kHuge, 4}).numel(), ConfigError);
  CHECK_THROWS_WITH(Shape({int64_t{1} << 40, int64_t{1} << 40}).numel(), Catch::Contains("(1099511627776, 1099511627776)"));
  CHECK(Shape{32, 1, 28, 28}.fits());
  CHECK(Shape{int64_t{1} << 46}.fits());          // exactly 2^48 bytes
  CHECK_FALSE(Shape{(int64_t{1} << 46) + 1}.fits());
  CHECK_FALSE(Shape{kHuge, kHuge}.fits());         // the product overflows: not a small wrapped value
  CHECK_FALSE(Shape{int64_t{1} << 31, int64_t{1} << 31, 4}.fits());
}

TEST_CASE("dense units near 2^63 are a config error naming the key", "[hardening][sizes]") {
  // Too large on its own: refused when the model is read.
  std::string m = error_of([] { kiln::test::model_from(dense_model("9223372036854775807")); });
  CHECK_THAT(m, Catch::Contains("model.layers[0].units") && Catch::Contains("9223372036854775807"));
  // Fine alone, too large times the features or the batch: refused when the graph is built, naming the key.
  auto spec = kiln::test::model_from(dense_model("1099511627776"));  // 2^40 units x 784 features
  m = error_of([&] { build(spec, 32); });
  CHECK_THAT(m, Catch::Contains("layer 'dense_") && Catch::Contains("kernel") &&
                    Catch::Contains("model.layers[0].units") && Catch::Contains("256 TiB"));
}

TEST_CASE("batch_size near 2^63 is a config error, not an overflowed plan", "[hardening][sizes]") {
  auto spec = kiln::test::model_from(dense_model("10"));
  std::string m = error_of([&] { build(spec, kHuge); });
  CHECK_THAT(m, Catch::Contains("[train] batch_size = " + std::to_string(kHuge)) && Catch::Contains("input_shape"));
  // A batch that fits as input but whose layer output does not names the layer and the batch.
  auto wide = kiln::test::model_from(dense_model("1048576", "[1]"));  // 2^20 units
  m = error_of([&] { build(wide, int64_t{1} << 30); });
  CHECK_THAT(m, Catch::Contains("output (batch, units)") && Catch::Contains("[train] batch_size"));
  // An input shape that alone overflows is refused when the model is read.
  m = error_of([] { kiln::test::model_from(dense_model("10", "[4611686018427387904, 4]")); });
  CHECK_THAT(m, Catch::Contains("model.input_shape"));
}

TEST_CASE("conv2d filters, kernels and strides near 2^63 are config errors, not overflow", "[hardening][sizes]") {
  const std::string conv = "[model]\ninput_shape = [3, 32, 32]\nloss = \"mse\"\n[[model.layers]]\ntype = \"conv2d\"\n";
  std::string m = error_of([&] { kiln::test::model_from(conv + "filters = 4611686018427387904\n"); });
  CHECK_THAT(m, Catch::Contains("model.layers[0].filters"));
  auto spec = kiln::test::model_from(conv + "filters = 1073741824\nkernel = 1048576\npadding = \"same\"\n");
  m = error_of([&] { build(spec, 8); });
  CHECK_THAT(m, Catch::Contains("kernel (filters") && Catch::Contains("model.layers[0].filters"));
  // Huge strides with "same" padding: a 1x1 output, computed without overflow.
  auto strided = kiln::test::model_from(conv + "filters = 4\nstrides = 9223372036854775807\npadding = \"same\"\n");
  auto g = build(strided, 2);
  REQUIRE(g.outputs.size() == 1);
  CHECK(g.tensor(g.outputs[0]).shape == Shape{2, 4, 1, 1});
}

TEST_CASE("a memory size of 2^64 bytes or more is refused, not turned into the whole device", "[hardening][sizes]") {
  CHECK(kiln::parse_memory_size("1GiB", 0) == size_t{1} << 30);
  CHECK(kiln::parse_memory_size("16000000TiB", 0) > 0);  // about 1.76e19 bytes, still below 2^64
  for (const char* text : {"1e30GiB", "17000000TiB", "18446744073709551616"}) {
    INFO(text);
    CHECK_THROWS_WITH(kiln::parse_memory_size(text, 0), Catch::Contains(text) && Catch::Contains("16 EiB"));
  }
}

TEST_CASE("kiln plan names [device] memory_limit = \"1e30GiB\" and huge units instead of printing FITS",
          "[hardening][sizes]") {
  auto dir = kiln::test::temp_dir("hard-sizes-plan");
  auto write = [&](const std::string& device, const std::string& units) {
    std::ofstream(dir / "run.toml") << "[device]\nbackend = \"cpu\"\n" << device << "\n" << dense_model(units)
                                    << "[train]\nbatch_size = 32\n";
    return (dir / "run.toml").string();
  };
  auto r = kiln::test::run_app("plan " + write("memory_limit = \"1e30GiB\"", "10"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("device.memory_limit") && Catch::Contains("16 EiB"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));

  r = kiln::test::run_app("plan " + write("", "4611686018427387904"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.layers[0].units"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));

  r = kiln::test::run_app("plan " + write("", "1099511627776"));  // 2^40 units: fits alone, not times 784 inputs
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("model.layers[0].units") && Catch::Contains("256 TiB"));
  CHECK_THAT(r.output, !Catch::Contains("FITS"));
}

TEST_CASE("a batch larger than the largest tensor is refused when the pipeline is built, naming batch_size",
          "[hardening][sizes]") {
  const std::string source = R"({type = "synthetic", shape = [4], examples = 8})";
  kiln::test::data::PipelineOptions o;
  o.global_batch = kHuge;
  std::string m = error_of([&] { kiln::test::data::build("stages = [" + source + R"(, {type = "batch"}])", o); });
  CHECK_THAT(m, Catch::Contains("[train] batch_size = " + std::to_string(kHuge)) && Catch::Contains("256 TiB"));
  m = error_of([&] { kiln::test::data::build("stages = [" + source + ", {type = \"batch\", size = " + std::to_string(kHuge) + "}]"); });
  CHECK_THAT(m, Catch::Contains("stages[1].size") && Catch::Contains("256 TiB"));
  // A large but possible batch is accepted (nothing is allocated until it is pulled).
  o.global_batch = int64_t{1} << 20;
  CHECK_NOTHROW(kiln::test::data::build("stages = [" + source + R"(, {type = "batch"}])", o));
}

TEST_CASE("a graph refuses any tensor above the largest size, whichever layer (a plugin's too) makes it",
          "[hardening][sizes]") {
  kiln::Graph g;
  kiln::TensorInfo t;
  t.name = "huge";
  t.layer = "plugin_layer";
  t.shape = Shape{int64_t{1} << 47};
  CHECK_THROWS_WITH(g.add_tensor(t), Catch::Contains("tensor 'huge' of layer 'plugin_layer'") &&
                                         Catch::Contains("(140737488355328,)") && Catch::Contains("256 TiB"));
  t.shape = Shape{int64_t{1} << 20};
  CHECK(g.add_tensor(t) == 0);
}
