// Stage::fill: a batch stage over a random-access pipeline writes every row in place (the source converts its bytes
// into the row, shape-preserving maps transform it there), giving exactly the batches the streaming pipeline gives,
// without building any example as its own tensors. Maps that change shapes, and maps whose workers read ahead,
// still give the same batches.
#include <atomic>
#include <catch2/catch.hpp>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

// Forwards random access to its upstream too, counting the calls of at() and fill(), and fill()'s rows.
class Counting final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  std::string name() const override { return "counting"; }
  bool random_access() const override { return up_->random_access(); }
  Element at(uint64_t k) override {
    ++at_calls;
    return up_->at(k);
  }
  void fill(std::span<const uint64_t> ks, float* x, float* y) override {
    ++fill_calls;
    fill_rows += ks.size();
    up_->fill(ks, x, y);
  }
  std::atomic<uint64_t> at_calls{0}, fill_calls{0}, fill_rows{0};
};

struct Built {
  std::unique_ptr<Stage> stage;
  Counting* counting = nullptr;  // right after the source
};

// `source` (one stage's TOML) and `before`, then a Counting stage (or a Streaming one: the reference), then `stages`.
Built pipeline(const std::string& source, const std::string& stages, bool streaming, uint64_t budget,
               const std::string& before = "") {
  PipelineOptions o;
  o.pipeline = "train";
  o.decoded_budget = budget;
  std::unique_ptr<Stage> cur = build("stages = [" + source + (before.empty() ? "" : ", " + before) + "]", o);
  Built b;
  if (streaming) {
    cur = std::make_unique<Streaming>(std::move(cur));
  } else {
    auto c = std::make_unique<Counting>(std::move(cur));
    b.counting = c.get();
    cur = std::move(c);
  }
  o.decoded_budget = 0;
  o.global_batch = 8;
  b.stage = add_stages(std::move(cur), "stages = [" + stages + "]", o);
  return b;
}

const std::string kInPlaceMaps =
    "{type = \"scale\", factor = 0.00392156862745098}, {type = \"map\", workers = 1, ops = [{op = \"normalize\", "
    "mean = [0.5], std = [0.25]}, {op = \"flip_horizontal\"}, {op = \"standardize\"}]}";

}  // namespace

TEST_CASE("a batch over a decoded idx source and in-place maps fills its rows with no per-example tensors",
          "[data][fill]") {
  const std::filesystem::path dir = test::temp_dir("fill-idx");
  const std::string src = write_idx(dir, 203, 4, 5);
  for (uint64_t budget : {uint64_t{0}, uint64_t{1} << 30}) {  // read through pread, and decoded once
    CAPTURE(budget);
    const std::string stages = kInPlaceMaps + ", {type = \"shuffle\", buffer = 64}, {type = \"batch\"}";
    Built got = pipeline(src, stages, false, budget);
    Built want = pipeline(src, stages, true, budget);
    for (uint64_t e : {0u, 1u}) {
      CAPTURE(e);
      got.counting->at_calls = got.counting->fill_calls = got.counting->fill_rows = 0;
      auto g = epoch(*got.stage, e), w = epoch(*want.stage, e);
      REQUIRE(w.size() == 26);  // 25 batches of 8 and one of 3
      CHECK(same(g, w));
      // Every row came through one fill() per batch; at() built no example.
      CHECK(got.counting->at_calls == 0);
      CHECK(got.counting->fill_calls == 26);
      CHECK(got.counting->fill_rows == 203);
    }
    // Two epochs flip different images (the op's draws depend on the epoch and the example's index).
    CHECK_FALSE(same(epoch(*got.stage, 0), epoch(*got.stage, 1)));
  }
}

// The Fashion-MNIST samples' pipeline with the scale right after the source (no counting stage between them): the
// decoded source converts and scales each row in one pass (the map asks it to). The batches must be bit for bit the
// streaming pipeline's, where the scale map multiplies each converted example by the factor.
TEST_CASE("a scale right after a decoded idx source scales in the source's pass, bit for bit", "[data][fill]") {
  const std::filesystem::path dir = test::temp_dir("fill-scaled");
  const std::string src = write_idx(dir, 203, 4, 5);
  for (const std::string& factor : {std::string("0.00392156862745098"), std::string("-3.7")}) {
    CAPTURE(factor);
    const std::string scale = "{type = \"scale\", factor = " + factor + "}";
    Built got = pipeline(src, "{type = \"shuffle\", buffer = 64}, {type = \"batch\"}", false, uint64_t{1} << 30, scale);
    Built want =
        pipeline(src, scale + ", {type = \"shuffle\", buffer = 64}, {type = \"batch\"}", true, uint64_t{1} << 30);
    for (uint64_t e : {0u, 1u}) {
      CAPTURE(e);
      auto g = epoch(*got.stage, e), w = epoch(*want.stage, e);
      REQUIRE(w.size() == 26);
      CHECK(same(g, w));
      CHECK(got.counting->fill_calls == 26 * (e + 1));  // the rows were filled, not read example by example
    }
    // Resumed mid-epoch, the rest of the epoch is the same too.
    got.stage->reset(1);
    (void)got.stage->next();
    const StageState st = got.stage->save();
    Built again =
        pipeline(src, "{type = \"shuffle\", buffer = 64}, {type = \"batch\"}", false, uint64_t{1} << 30, scale);
    again.stage->restore(st);
    std::vector<Element> rest, want_rest = epoch(*want.stage, 1);
    while (auto b = again.stage->next()) rest.push_back(std::move(*b));
    REQUIRE(rest.size() == 25);
    CHECK(same(rest, std::vector<Element>(want_rest.begin() + 1, want_rest.end())));
  }
}

TEST_CASE("fill of every stage writes exactly what at() gives, row by row", "[data][fill]") {
  const std::filesystem::path dir = test::temp_dir("fill-rows");
  const std::string src = write_idx(dir, 50, 4, 5);
  // In-place maps, a map that changes the shape (random_crop, one_hot: fill falls back to at()), and a shuffle.
  const std::string shape_changing =
      "{type = \"map\", workers = 1, ops = [{op = \"random_crop\", size = [3, 3], padding = 1}, {op = \"one_hot\", "
      "classes = 10}]}";
  for (const std::string& stages :
       {kInPlaceMaps + ", {type = \"shuffle\", buffer = 16}", shape_changing + ", {type = \"shuffle\", buffer = 16}"}) {
    CAPTURE(stages);
    Built b = pipeline(src, stages, false, uint64_t{1} << 30);
    b.stage->reset(1);
    REQUIRE(b.stage->random_access());
    const auto xn = static_cast<size_t>(b.stage->example_shape().numel());
    const auto yn = static_cast<size_t>(b.stage->label_shape().numel());
    const std::vector<uint64_t> ks = {49, 0, 17, 17, 3};
    std::vector<float> x(ks.size() * xn, -1.f), y(ks.size() * yn, -1.f);
    b.stage->fill(ks, x.data(), y.data());
    for (size_t r = 0; r < ks.size(); ++r) {
      CAPTURE(r);
      Element e = b.stage->at(ks[r]);
      CHECK(std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(r * xn),
                               x.begin() + static_cast<std::ptrdiff_t>((r + 1) * xn)) == e.x.data);
      CHECK(std::vector<float>(y.begin() + static_cast<std::ptrdiff_t>(r * yn),
                               y.begin() + static_cast<std::ptrdiff_t>((r + 1) * yn)) == e.y.data);
    }
    // A position past the epoch is refused, naming it.
    const std::vector<uint64_t> bad = {50};
    CHECK_THROWS_WITH(b.stage->fill(bad, x.data(), y.data()), Catch::Contains("50"));
  }
}

TEST_CASE("a batch over maps whose workers read ahead collects their rows and equals the streaming batches",
          "[data][fill]") {
  const std::filesystem::path dir = test::temp_dir("fill-workers");
  const std::string src = write_idx(dir, 203, 4, 5);
  const std::string stages =
      "{type = \"map\", workers = 2, ops = [{op = \"random_crop\", size = [4, 5], padding = 1}, {op = "
      "\"scale\", factor = 0.5}]}, {type = \"shuffle\", buffer = 64}, {type = \"batch\"}";
  Built got = pipeline(src, stages, false, uint64_t{1} << 30);
  Built want = pipeline(src, stages, true, uint64_t{1} << 30);
  for (uint64_t e : {0u, 1u}) {
    CAPTURE(e);
    got.counting->fill_calls = 0;
    CHECK(same(epoch(*got.stage, e), epoch(*want.stage, e)));
    CHECK(got.counting->fill_calls == 0);  // the workers read through at() on their own threads
    CHECK(got.counting->at_calls > 0);
  }
}

TEST_CASE("a complete memory cache copies its examples into the batch rows, as the streaming cache delivers them",
          "[data][fill][cache]") {
  const std::filesystem::path dir = test::temp_dir("fill-cache");
  const std::string src = write_idx(dir, 203, 4, 5);
  // The ResNet sample's shape: scale and normalize once, cache, [counting], flip per epoch (workers = 2: in-place
  // ops are filled in the batch's thread all the same), shuffle, batch.
  const std::string before = kInPlaceMaps + ", {type = \"cache\"}";
  const std::string after =
      "{type = \"map\", workers = 2, ops = [{op = \"flip_horizontal\"}]}, {type = \"shuffle\", "
      "buffer = 64}, {type = \"batch\"}";
  Built got = pipeline(src, after, false, uint64_t{1} << 30, before);
  Built want = pipeline(src, after, true, uint64_t{1} << 30, before);
  // Epoch 0 fills the cache's slots (the default fill, through the cache's at()); from epoch 1 the complete cache
  // copies its examples into the rows itself. Both must give the streaming pipeline's batches.
  for (uint64_t e : {0u, 1u, 2u}) {
    CAPTURE(e);
    got.counting->at_calls = got.counting->fill_calls = 0;
    CHECK(same(epoch(*got.stage, e), epoch(*want.stage, e)));
    CHECK(got.counting->fill_calls == 26);  // the flip map's workers did not take the rows over
    CHECK(got.counting->at_calls == 0);
  }
}
