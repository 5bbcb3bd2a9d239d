// Random access through the pipeline: shuffle and map over a source with random access give exactly what they give
// over a streaming one, map's at(k) is its k-th next() at any worker count, a batch stage with a row share reads
// only those rows, and saved positions restore exactly in either mode.
#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

const std::string kSource =
    "stages = [{type = \"synthetic\", shape = [2, 4, 4], classes = 5, examples = 203, seed = 7}]";

struct Build {
  bool streaming = false;  // hide the source's random access
  int64_t rows_begin = 0;  // the batch stage's share
  int64_t rows_end = 0;
};

// The synthetic source, then `stages` (a TOML list body), built as the host does.
std::unique_ptr<Stage> pipeline(const std::string& stages, const Build& b = {}) {
  std::unique_ptr<Stage> cur = build(kSource);
  if (b.streaming) cur = std::make_unique<Streaming>(std::move(cur));
  PipelineOptions o;
  o.global_batch = 8;
  o.pipeline = "train";
  o.rows_begin = b.rows_begin;
  o.rows_end = b.rows_end;
  return add_stages(std::move(cur), "stages = [" + stages + "]", o);
}

std::string augment(int workers) {
  return "{type = \"map\", workers = " + std::to_string(workers) +
         ", ops = [{op = \"random_crop\", size = [4, 4], padding = 1}, {op = \"flip_horizontal\"}, {op = "
         "\"scale\", factor = 0.5}]}";
}

}  // namespace

TEST_CASE("shuffle over a random-access source delivers the streaming shuffle's sequence", "[data][random_access]") {
  for (int buffer : {1, 2, 7, 64, 203, 5000}) {
    CAPTURE(buffer);
    const std::string st = "{type = \"shuffle\", buffer = " + std::to_string(buffer) + "}";
    auto ra = pipeline(st), ref = pipeline(st, {.streaming = true});
    for (uint64_t e : {0u, 1u}) {
      CAPTURE(e);
      auto want = epoch(*ref, e);
      ra->reset(e);
      REQUIRE(ra->random_access());
      REQUIRE_FALSE(ref->random_access());
      std::vector<Element> by_at;
      for (uint64_t k = 0; k < want.size(); ++k) by_at.push_back(ra->at(k));
      auto got = drain(*ra);
      REQUIRE(want.size() == 203);
      CHECK(same(got, want));
      CHECK(same(by_at, want));
    }
    // Two epochs differ (the order is reseeded), and the shuffle reads nothing more than the epoch.
    if (buffer > 1) CHECK_FALSE(labels(epoch(*ra, 0)) == labels(epoch(*ra, 1)));
  }
}

TEST_CASE("map at(k) is its k-th next() with 1 and 3 workers and equals the streaming map", "[data][random_access]") {
  auto ref = pipeline(augment(1), {.streaming = true});
  for (int workers : {1, 3}) {
    CAPTURE(workers);
    auto ra = pipeline(augment(workers) + ", {type = \"shuffle\", buffer = 50}, " + augment(workers));
    auto ref2 = pipeline(augment(1) + ", {type = \"shuffle\", buffer = 50}, " + augment(1), {.streaming = true});
    for (uint64_t e : {0u, 1u}) {
      CAPTURE(e);
      auto want = epoch(*ref2, e);
      ra->reset(e);
      REQUIRE(ra->random_access());
      std::vector<Element> by_at;
      for (uint64_t k = 0; k < want.size(); ++k) by_at.push_back(ra->at(k));
      CHECK(same(drain(*ra), want));
      CHECK(same(by_at, want));
    }
    auto single = pipeline(augment(workers));
    CHECK(same(epoch(*single, 1), epoch(*ref, 1)));
  }
}

TEST_CASE("a batch stage with a row share reads only those rows of full batches through at()",
          "[data][random_access]") {
  const std::string st = augment(2) + ", {type = \"shuffle\", buffer = 64}, {type = \"batch\"}";
  auto all = pipeline(st);
  auto part = pipeline(st, {.rows_begin = 2, .rows_end = 6});
  auto want = epoch(*all, 1);
  auto got = epoch(*part, 1);
  REQUIRE(got.size() == want.size());
  REQUIRE(want.size() == 26);  // 25 batches of 8 and one of 3
  const size_t xn = 32;
  for (size_t b = 0; b < want.size(); ++b) {
    CAPTURE(b);
    REQUIRE(got[b].batch == want[b].batch);
    if (want[b].batch < 8) {  // the last, smaller batch: every row
      CHECK(same(got[b], want[b]));
      continue;
    }
    for (size_t r = 0; r < 8; ++r) {
      const bool mine = r >= 2 && r < 6;
      std::vector<float> gx(got[b].x.data.begin() + r * xn, got[b].x.data.begin() + (r + 1) * xn),
          wx(want[b].x.data.begin() + r * xn, want[b].x.data.begin() + (r + 1) * xn);
      CHECK((mine ? gx == wx : gx == std::vector<float>(xn, 0.f)));
      CHECK(got[b].y.data[r] == (mine ? want[b].y.data[r] : 0.f));
    }
  }
  // The source made the examples of the rows alone: 4 of each full batch, the last batch whole.
  CHECK(stats_of(*part, "synthetic").elements == 25 * 4 + 3);
  CHECK(stats_of(*all, "synthetic").elements == 203);
}

TEST_CASE("mid-epoch save and restore over random access are exact, and each mode restores the other's state",
          "[data][random_access]") {
  const std::string st = augment(3) + ", {type = \"shuffle\", buffer = 40}, " + augment(3) + ", {type = \"batch\"}";
  const Build modes[] = {{}, {.streaming = true}, {.rows_begin = 0, .rows_end = 4}};
  auto full = pipeline(st);
  for (uint64_t e : {0u, 1u}) {
    auto want = epoch(*full, e);
    for (size_t cut : {1u, 7u, 25u}) {
      for (size_t from = 0; from < 3; ++from)
        for (size_t to = 0; to < 3; ++to) {
          CAPTURE(e, cut, from, to);
          auto a = pipeline(st, modes[from]);
          a->reset(e);
          drain(*a, cut);
          StageState s = a->save();
          if (from == 2) {  // the state does not depend on which rows were read, nor how
            auto every = pipeline(st);
            every->reset(e);
            drain(*every, cut);
            CHECK(every->save() == s);
          }
          auto b = pipeline(st, modes[to]);
          b->reset(e);
          b->restore(s);
          auto rest = drain(*b);
          REQUIRE(rest.size() == want.size() - cut);
          for (size_t i = 0; i < rest.size(); ++i) {
            CAPTURE(i);
            const Element& w = want[cut + i];
            if (modes[to].rows_end == 0 || w.batch < 8) {
              CHECK(same(rest[i], w));
            } else {  // rows 0..3 only
              CHECK(std::equal(rest[i].x.data.begin(), rest[i].x.data.begin() + 4 * 32, w.x.data.begin()));
              CHECK(std::equal(rest[i].y.data.begin(), rest[i].y.data.begin() + 4, w.y.data.begin()));
            }
          }
        }
    }
  }
}

TEST_CASE("shuffle hands its order to a parallel map, which reads it ahead, with the streaming sequence",
          "[data][random_access]") {
  const std::string st = augment(3) + ", {type = \"shuffle\", buffer = 30}";
  auto ra = pipeline(st), ref = pipeline(st, {.streaming = true});
  for (uint64_t e : {0u, 1u}) {
    CAPTURE(e);
    auto want = epoch(*ref, e);
    CHECK(same(epoch(*ra, e), want));
    // Restored mid-epoch, the map reads on from that draw.
    ra->reset(e);
    drain(*ra, 17);
    auto fresh = pipeline(st);
    fresh->reset(e);
    fresh->restore(ra->save());
    CHECK(same(drain(*fresh), std::vector<Element>(want.begin() + 17, want.end())));
  }
  CHECK(stats_of(*ra, "map").busy_seconds > 0);
}

TEST_CASE("map workers default to auto and take a number or auto", "[data][random_access]") {
  CHECK(pipeline("{type = \"map\", ops = [{op = \"scale\", factor = 2.0}]}") != nullptr);
  CHECK(pipeline("{type = \"map\", workers = \"auto\", ops = [{op = \"scale\", factor = 2.0}]}") != nullptr);
  CHECK_THROWS_WITH(pipeline("{type = \"map\", workers = \"many\", ops = [{op = \"scale\", factor = 2.0}]}"),
                    Catch::Contains("key 'stages[0].workers'") &&
                        Catch::Contains("is \"many\": expected \"auto\" (half the cores, 2 to 4) or a number"));
  CHECK_THROWS_WITH(pipeline("{type = \"map\", workers = 0, ops = [{op = \"scale\", factor = 2.0}]}"),
                    Catch::Contains("must be in 1..256, got 0"));
}

TEST_CASE("a batch stage reuses the batches handed back and gives the same batches, other rows still zero",
          "[data][random_access]") {
  // One map worker: the rows are filled in place (with more, a map that crops reads ahead on its threads and the
  // batch stage collects its examples, a path that builds every batch anew).
  const std::string st = augment(1) + ", {type = \"shuffle\", buffer = 64}, {type = \"batch\"}";
  for (const Build& share : {Build{}, Build{.rows_begin = 2, .rows_end = 6}}) {
    CAPTURE(share.rows_end);
    auto ref = pipeline(st, share);
    auto s = pipeline(st, share);
    const auto want = epoch(*ref, 1);
    s->reset(1);
    std::vector<Element> got;
    size_t reused = 0;
    const float* handed_back = nullptr;
    while (auto b = s->next()) {
      if (b->x.data.data() == handed_back) ++reused;
      got.push_back(*b);
      // NaN everywhere before it goes back: a row the stage does not write again shows.
      std::fill(b->x.data.begin(), b->x.data.end(), std::numeric_limits<float>::quiet_NaN());
      std::fill(b->y.data.begin(), b->y.data.end(), std::numeric_limits<float>::quiet_NaN());
      handed_back = b->x.data.data();
      s->recycle(std::move(*b));
    }
    REQUIRE(got.size() == 26);
    CHECK(same(got, want));  // the rows outside a share are zero in both
    CHECK(reused == 24);     // every full batch after the first (the last, smaller one needs other sizes)
  }
}
