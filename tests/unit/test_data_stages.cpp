// Semantics of the transforming stages: map ops, scale, shuffle, batch, prefetch, and their config checks (a batch
// larger than the largest tensor is refused when the pipeline is built).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <set>

#include "kiln/error.hpp"
#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {
const std::string kSynth = R"({type = "synthetic", shape = [2, 4, 4], classes = 10, examples = 64, seed = 3})";
}

TEST_CASE("scale stage and scale op multiply features by the factor, scale defaults to 1/255", "[data]") {
  auto dir = kiln::test::temp_dir("data-scale");
  std::string idx = write_idx(dir, 6);
  auto raw = drain(*build("stages = [" + idx + "]"));
  auto s1 = drain(*build("stages = [" + idx + ", {type = \"scale\", factor = 0.5}]"));
  auto s2 = drain(*build("stages = [" + idx + ", {type = \"map\", ops = [{op = \"scale\", factor = 0.5}]}]"));
  auto s3 = drain(*build("stages = [" + idx + ", {type = \"scale\"}]"));
  REQUIRE(same(s1, s2));
  for (size_t i = 0; i < raw.size(); ++i)
    for (size_t j = 0; j < raw[i].x.data.size(); ++j) {
      REQUIRE(s1[i].x.data[j] == raw[i].x.data[j] * 0.5f);
      REQUIRE(s3[i].x.data[j] == Approx(raw[i].x.data[j] / 255.0));
      REQUIRE(s3[i].x.data[j] <= 1.0f);
    }
  REQUIRE(labels(s1) == labels(raw));
}

TEST_CASE("normalize op subtracts the per-channel mean and divides by the per-channel std", "[data]") {
  auto raw = drain(*build("stages = [" + kSynth + "]"));
  auto n = drain(*build("stages = [" + kSynth +
                        R"(, {type = "map", ops = [{op = "normalize", mean = [1.0, -2], std = [2, 0.5]}]}])"));
  for (size_t i = 0; i < raw.size(); ++i)
    for (size_t j = 0; j < 32; ++j) {
      const float m = j < 16 ? 1.f : -2.f, s = j < 16 ? 2.f : 0.5f;
      REQUIRE(n[i].x.data[j] == Approx((raw[i].x.data[j] - m) / s));
    }
}

TEST_CASE("standardize op gives every example zero mean and unit variance", "[data]") {
  auto s = drain(*build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "standardize"}]}])"));
  for (auto& e : s) {
    double sum = 0, sq = 0;
    for (float v : e.x.data) sum += v;
    for (float v : e.x.data) sq += (v - sum / 32) * (v - sum / 32);
    REQUIRE(std::abs(sum / 32) < 1e-5);
    REQUIRE(sq / 32 == Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("one_hot op turns the class index into a (classes) vector", "[data]") {
  auto raw = drain(*build("stages = [" + kSynth + "]"));
  auto p = build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "one_hot", classes = 10}]}])");
  REQUIRE(p->label_shape() == Shape{10});
  auto s = drain(*p);
  for (size_t i = 0; i < s.size(); ++i) {
    REQUIRE(s[i].y.shape == Shape{10});
    for (size_t k = 0; k < 10; ++k) REQUIRE(s[i].y.data[k] == (k == static_cast<size_t>(raw[i].y.data[0]) ? 1.f : 0.f));
  }
  // A label outside 0..classes-1 is a DataError.
  auto bad = build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "one_hot", classes = 3}]}])");
  REQUIRE_THROWS_AS(drain(*bad), DataError);
}

TEST_CASE("random_crop pads with zeros and crops a window of the padded image", "[data]") {
  auto raw = drain(*build("stages = [" + kSynth + "]"));
  auto p =
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "random_crop", size = [4, 4], padding = 2}]}])");
  REQUIRE(p->example_shape() == Shape({2, 4, 4}));
  auto s = drain(*p);
  std::set<std::pair<int, int>> offsets;
  for (size_t i = 0; i < s.size(); ++i) {
    // Find the offset (dy, dx) in -2..2 that explains the output.
    bool found = false;
    for (int dy = -2; dy <= 2 && !found; ++dy)
      for (int dx = -2; dx <= 2 && !found; ++dx) {
        bool ok = true;
        for (int c = 0; c < 2 && ok; ++c)
          for (int y = 0; y < 4 && ok; ++y)
            for (int x = 0; x < 4 && ok; ++x) {
              int sy = y + dy, sx = x + dx;
              float want = sy < 0 || sy >= 4 || sx < 0 || sx >= 4 ? 0.f : raw[i].x.data[(c * 4 + sy) * 4 + sx];
              ok = s[i].x.data[(c * 4 + y) * 4 + x] == want;
            }
        if (ok) found = true, offsets.insert({dy, dx});
      }
    REQUIRE(found);
  }
  REQUIRE(offsets.size() > 5);  // the offset is random, not fixed
  // A smaller crop changes the shape.
  auto q = build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "random_crop", size = 3}]}])");
  REQUIRE(q->example_shape() == Shape({2, 3, 3}));
  REQUIRE(drain(*q)[0].x.data.size() == 18);
}

TEST_CASE("flip_horizontal mirrors the width with the given probability", "[data]") {
  auto raw = drain(*build("stages = [" + kSynth + "]"));
  auto flip_all =
      drain(*build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "flip_horizontal", probability = 1}]}])"));
  auto flip_none =
      drain(*build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "flip_horizontal", probability = 0}]}])"));
  auto flip_half = drain(*build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "flip_horizontal"}]}])"));
  REQUIRE(same(flip_none, raw));
  int flipped = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    for (size_t row = 0; row < 8; ++row)
      for (size_t x = 0; x < 4; ++x) REQUIRE(flip_all[i].x.data[row * 4 + x] == raw[i].x.data[row * 4 + 3 - x]);
    flipped += flip_half[i].x.data == flip_all[i].x.data;
  }
  REQUIRE(flipped > 16);
  REQUIRE(flipped < 48);
}

TEST_CASE("map random ops give the same elements for 1, 2 and 4 workers and differ across epochs", "[data]") {
  auto make = [](int workers) {
    return build("stages = [" + kSynth + R"(, {type = "map", workers = )" + std::to_string(workers) +
                 R"(, ops = [{op = "random_crop", size = [4, 4], padding = 1}, {op = "flip_horizontal"},)"
                 R"( {op = "one_hot", classes = 10}]}])");
  };
  auto p1 = make(1), p2 = make(2), p4 = make(4);
  auto e1 = epoch(*p1, 0), e2 = epoch(*p2, 0), e4 = epoch(*p4, 0);
  REQUIRE(e1.size() == 64);
  REQUIRE(same(e1, e2));
  REQUIRE(same(e1, e4));
  auto n1 = epoch(*p1, 1), n4 = epoch(*p4, 1);
  REQUIRE(same(n1, n4));
  REQUIRE_FALSE(same(e1, n1));       // fresh augmentation every epoch
  REQUIRE(same(epoch(*p2, 0), e1));  // and the same again for the same epoch
}

TEST_CASE("map after batch transforms every example of the batch", "[data]") {
  auto p =
      build("stages = [" + kSynth +
            R"(, {type = "batch", size = 10}, {type = "map", workers = 2, ops = [{op = "one_hot", classes = 10}]}])");
  auto b = drain(*p);
  REQUIRE(b.size() == 7);
  REQUIRE(b[0].y.shape == Shape({10, 10}));
  REQUIRE(b[6].y.shape == Shape({4, 10}));
  REQUIRE(b[6].batch == 4);
}

TEST_CASE("shuffle is a permutation, differs per epoch and seed, and repeats for the same seed", "[data]") {
  auto dir = kiln::test::temp_dir("data-shuffle");
  std::string idx = write_idx(dir, 100, 1, 1);
  auto make = [&](const std::string& extra) {
    return build("stages = [" + idx + ", {type = \"shuffle\", buffer = 30" + extra + "}]");
  };
  auto a = make(""), b = make(""), c = make(", seed = 99");
  auto first = [](const std::vector<Element>& es) {
    std::vector<float> v;
    for (auto& e : es) v.push_back(e.x.data[0] * 1000 + e.y.data[0]);
    return v;
  };
  auto a0 = first(epoch(*a, 0)), a1 = first(epoch(*a, 1)), b0 = first(epoch(*b, 0)), c0 = first(epoch(*c, 0));
  auto plain = first(drain(*build("stages = [" + idx + "]")));
  REQUIRE(a0.size() == 100);
  REQUIRE(a0 == b0);
  REQUIRE(a0 != a1);
  REQUIRE(a0 != c0);
  REQUIRE(a0 != plain);
  auto sorted = a0, sorted_plain = plain;
  std::sort(sorted.begin(), sorted.end());
  std::sort(sorted_plain.begin(), sorted_plain.end());
  REQUIRE(sorted == sorted_plain);
  // With a buffer of 30, no element moves earlier than 29 places ahead of its source position.
  for (size_t k = 0; k < a0.size(); ++k) {
    size_t src = static_cast<size_t>(std::find(plain.begin(), plain.end(), a0[k]) - plain.begin());
    REQUIRE(src <= k + 29);
  }
}

TEST_CASE("batch stacks examples, the last batch is partial unless drop_remainder", "[data]") {
  auto dir = kiln::test::temp_dir("data-batch");
  std::string idx = write_idx(dir, 10, 2, 3);
  auto p = build("stages = [" + idx + ", {type = \"batch\", size = 4}]");
  auto b = drain(*p);
  REQUIRE(b.size() == 3);
  REQUIRE(b[0].batch == 4);
  REQUIRE(b[0].x.shape == Shape({4, 1, 2, 3}));
  REQUIRE(b[0].y.shape == Shape{4});
  REQUIRE(b[2].batch == 2);
  REQUIRE(b[2].x.shape == Shape({2, 1, 2, 3}));
  REQUIRE(labels(b) == labels(drain(*build("stages = [" + idx + "]"))));
  REQUIRE(b[1].x.data[6] == pixel(5, 0, 0));  // example 5 is the second of batch 1

  auto d = build("stages = [" + idx + ", {type = \"batch\", size = 4, drop_remainder = true}]");
  REQUIRE(drain(*d).size() == 2);
  REQUIRE(d->size_hint() == 8);
}

TEST_CASE("batch size defaults to the global batch and must agree with it when given", "[data]") {
  PipelineOptions o;
  o.global_batch = 16;
  auto p = build("stages = [" + kSynth + ", {type = \"batch\"}]", o);
  REQUIRE(drain(*p)[0].batch == 16);
  REQUIRE(build("stages = [" + kSynth + ", {type = \"batch\", size = 16}]", o));
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"batch\", size = 8}]", o), ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"batch\"}]"), ConfigError);  // no size at all
}

namespace {

constexpr int64_t kHuge = int64_t{1} << 62;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST_CASE("a batch larger than the largest tensor is refused when the pipeline is built, naming batch_size",
          "[hardening][sizes]") {
  const std::string source = R"({type = "synthetic", shape = [4], examples = 8})";
  kiln::test::data::PipelineOptions o;
  o.global_batch = kHuge;
  std::string m = error_of([&] { kiln::test::data::build("stages = [" + source + R"(, {type = "batch"}])", o); });
  CHECK_THAT(m, Catch::Contains("[train] batch_size = " + std::to_string(kHuge)) && Catch::Contains("256 TiB"));
  m = error_of([&] {
    kiln::test::data::build("stages = [" + source + ", {type = \"batch\", size = " + std::to_string(kHuge) + "}]");
  });
  CHECK_THAT(m, Catch::Contains("stages[1].size") && Catch::Contains("256 TiB"));
  // A large but possible batch is accepted (nothing is allocated until it is pulled).
  o.global_batch = int64_t{1} << 20;
  CHECK_NOTHROW(kiln::test::data::build("stages = [" + source + R"(, {type = "batch"}])", o));
}

TEST_CASE("prefetch delivers exactly the upstream elements and re-throws upstream errors in next()", "[data]") {
  auto plain = drain(*build("stages = [" + kSynth + ", {type = \"batch\", size = 5}]"));
  auto p = build("stages = [" + kSynth + ", {type = \"batch\", size = 5}, {type = \"prefetch\", depth = 3}]");
  REQUIRE(same(epoch(*p, 0), plain));
  REQUIRE(same(epoch(*p, 0), plain));
  // An error raised in the prefetch thread (one_hot with too few classes) reaches the consumer as DataError.
  auto bad =
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "one_hot", classes = 2}]}, {type = "prefetch"}])");
  REQUIRE_THROWS_AS(drain(*bad), DataError);
}

TEST_CASE("prefetch destroyed or reset mid-epoch stops its thread without hanging", "[data]") {
  for (int i = 0; i < 20; ++i) {
    auto p = build(R"(stages = [{type = "synthetic", shape = [8], examples = 1000}, {type = "prefetch", depth = 2}])");
    REQUIRE(p->next());
    if (i % 2) p->reset(1);  // stop + join, then destroy
  }
  auto p = build(R"(stages = [{type = "synthetic", shape = [8], examples = 50}, {type = "prefetch", depth = 4}])");
  p->next();
  p->reset(0);
  REQUIRE(drain(*p).size() == 50);
}

TEST_CASE("stats count elements per stage and the time each spends", "[data]") {
  auto p = build("stages = [" + kSynth +
                 R"(, {type = "map", ops = [{op = "standardize"}]}, {type = "batch", size = 8}, {type = "prefetch"}])");
  drain(*p);
  std::vector<StageStats> st;
  p->collect_stats(st);
  REQUIRE(st.size() == 4);
  REQUIRE(st[0].name == "synthetic");
  REQUIRE(st[0].elements == 64);
  REQUIRE(st[1].name == "map");
  REQUIRE(st[1].elements == 64);
  REQUIRE(st[2].name == "batch");
  REQUIRE(st[2].elements == 8);
  REQUIRE(st[3].name == "prefetch");
  REQUIRE(st[3].elements == 8);
  REQUIRE(st[0].busy_seconds > 0);
  REQUIRE(st[2].wait_seconds >= st[1].busy_seconds);  // the batch waited while map worked
}

TEST_CASE("stage configs are validated: unknown keys, bad values, position of sources", "[data]") {
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"shuffle\", buffer = 10, bufer = 3}]"), ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"shuffle\"}]"), ConfigError);  // buffer required
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"shuffle\", buffer = 0}]"), ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", " + kSynth + "]"), ConfigError);  // source not first
  REQUIRE_THROWS_AS(build(R"(stages = [{type = "batch", size = 2}])"), ConfigError);   // no source
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "blur"}]}])"), ConfigError);
  REQUIRE_THROWS_AS(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "normalize", mean = [1, 2, 3], std = [1]}]}])"),
      ConfigError);  // 3 means for 2 channels
  REQUIRE_THROWS_AS(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "normalize", mean = [0], std = [0]}]}])"),
      ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "random_crop", size = [9, 9]}]}])"),
                    ConfigError);  // larger than the image
  REQUIRE_THROWS_AS(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "scale", factor = 2, extra = 1}]}])"),
      ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"cache\", kind = \"disk\"}]"), ConfigError);
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"cache\", kind = \"file\"}]"), ConfigError);  // no path
  REQUIRE_THROWS_AS(build("stages = [" + kSynth + ", {type = \"prefetch\", depth = 0}]"), ConfigError);
  try {
    build("stages = [" + kSynth + ", {type = \"shuffle\", buffer = 10, bufer = 3}]");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("bufer"));
  }
}

TEST_CASE("center_crop takes the window at the centre, deterministically, and checks its size", "[data]") {
  const std::string synth = R"({type = "synthetic", shape = [2, 5, 6], classes = 10, examples = 8, seed = 3})";
  auto raw = drain(*build("stages = [" + synth + "]"));
  auto p = build("stages = [" + synth + R"(, {type = "map", ops = [{op = "center_crop", size = [3, 2]}]}])");
  REQUIRE(p->example_shape() == Shape({2, 3, 2}));
  auto s = drain(*p);
  REQUIRE(s.size() == raw.size());
  for (size_t i = 0; i < s.size(); ++i)
    for (int c = 0; c < 2; ++c)
      for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 2; ++x)  // offset ((5 - 3) / 2, (6 - 2) / 2) = (1, 2)
          REQUIRE(s[i].x.data[(c * 3 + y) * 2 + x] == raw[i].x.data[(c * 5 + y + 1) * 6 + x + 2]);
  CHECK_THROWS_WITH(
      build("stages = [" + synth + R"(, {type = "map", ops = [{op = "center_crop", size = [6, 2]}]}])"),
      Catch::Contains("pipeline.toml:") && Catch::Contains("size") && Catch::Contains("does not fit in the 5 x 6"));
  CHECK_THROWS_WITH(build("stages = [" + synth + R"(, {type = "map", ops = [{op = "center_crop"}]}])"),
                    Catch::Contains("size") && Catch::Contains("is missing"));
}

TEST_CASE("random augmentation in a test pipeline is a config error that says what to write instead", "[data]") {
  PipelineOptions test;
  test.pipeline = "test";
  CHECK_THROWS_WITH(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "random_crop", size = [3, 3]}]}])", test),
      Catch::Contains("pipeline.toml:") && Catch::Contains("op") && Catch::Contains("[data.test]") &&
          Catch::Contains("op = \"center_crop\", size = [3, 3]"));
  CHECK_THROWS_WITH(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "random_crop", size = [4, 4], padding = 2}]}])",
            test),
      Catch::Contains("remove the op here"));
  CHECK_THROWS_WITH(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "flip_horizontal"}]}])", test),
      Catch::Contains("flip_horizontal is a training augmentation") && Catch::Contains("remove the op here"));
  // The evaluation form is accepted there; the augmentation is accepted in training.
  CHECK_NOTHROW(
      build("stages = [" + kSynth + R"(, {type = "map", ops = [{op = "center_crop", size = [3, 3]}]}])", test));
  PipelineOptions train;
  train.pipeline = "train";
  CHECK_NOTHROW(build("stages = [" + kSynth +
                          R"(, {type = "map", ops = [{op = "random_crop", size = [3, 3]}, {op = "flip_horizontal"}]}])",
                      train));
}
