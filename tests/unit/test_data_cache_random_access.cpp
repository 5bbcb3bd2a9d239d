// A cache with random access: a memory cache over an upstream with at() fills slot by slot from its first epoch and
// lets the shuffle after it read in place; a complete cache (memory or file) answers at(k). The elements are those
// of the sequential cache in every epoch, at every map worker count, after an epoch cut short, and across a resume.
#include <catch2/catch.hpp>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

// synthetic (203 examples) > map(random crop, flip: its epoch-0 output is what the cache holds) > [streaming] >
// `rest` (a TOML list body starting with the cache).
std::unique_ptr<Stage> pipeline(const std::string& rest, bool streaming) {
  std::unique_ptr<Stage> cur = build(
      "stages = [{type = \"synthetic\", shape = [2, 4, 4], classes = 5, examples = 203, seed = 7}, "
      "{type = \"map\", ops = [{op = \"random_crop\", size = [4, 4], padding = 1}, {op = \"flip_horizontal\"}]}]");
  if (streaming) cur = std::make_unique<Streaming>(std::move(cur));
  PipelineOptions o;
  o.global_batch = 8;
  o.pipeline = "train";
  return add_stages(std::move(cur), "stages = [" + rest + "]", o);
}

std::string after_cache(int workers) {
  return "{type = \"cache\"}, {type = \"map\", workers = " + std::to_string(workers) +
         ", ops = [{op = \"flip_horizontal\"}]}, {type = \"shuffle\", buffer = 500}, {type = \"batch\"}";
}

}  // namespace

TEST_CASE("memory cache over random access: the sequential cache's elements, each example read once",
          "[data][cache][random_access]") {
  auto ref = pipeline(after_cache(1), true);
  for (int workers : {1, 3}) {
    CAPTURE(workers);
    auto ra = pipeline(after_cache(workers), false);
    for (uint64_t e : {0u, 1u, 2u}) {
      CAPTURE(e);
      auto want = epoch(*ref, e);
      auto got = epoch(*ra, e);
      REQUIRE(want.size() == 26);
      CHECK(same(got, want));
    }
    // The upstream's examples were each made once, in the first epoch: no buffered refill, no second read.
    CHECK(stats_of(*ra, "synthetic").elements == 203);
  }
  // Random access from the first epoch (the shuffle after it then reads in place rather than buffering).
  auto cache_only = pipeline("{type = \"cache\"}", false);
  cache_only->reset(0);
  CHECK(cache_only->random_access());
  auto seq = pipeline("{type = \"cache\"}", true);
  seq->reset(0);
  CHECK_FALSE(seq->random_access());
  const auto want = epoch(*seq, 0);
  for (uint64_t k : {202u, 0u, 57u, 57u}) CHECK(same(cache_only->at(k), want[k]));
  CHECK_THROWS_WITH(cache_only->at(203), Catch::Contains("cache holds 203"));
  // The sequential cache has random access once complete.
  seq->reset(1);
  REQUIRE(seq->random_access());
  CHECK(same(seq->at(57), want[57]));
}

TEST_CASE("memory cache over random access: an epoch cut short, then whole epochs, then a resume",
          "[data][cache][random_access]") {
  auto ref = pipeline(after_cache(1), true);
  auto ra = pipeline(after_cache(2), false);
  ra->reset(0);
  auto part = drain(*ra, 5);  // steps_per_epoch = 5: most slots stay empty
  auto want0 = epoch(*ref, 0);
  for (size_t i = 0; i < part.size(); ++i) CHECK(same(part[i], want0[i]));
  for (uint64_t e : {1u, 2u}) {
    CAPTURE(e);
    CHECK(same(epoch(*ra, e), epoch(*ref, e)));
  }
  // A new process resumes mid-epoch 1 of a cache still filling: the rest of the epoch is the reference's.
  auto want1 = epoch(*ref, 1);
  auto a = pipeline(after_cache(2), false);
  a->reset(0);
  drain(*a, 3);
  a->reset(1);
  drain(*a, 9);
  StageState s = a->save();
  auto b = pipeline(after_cache(2), false);
  b->reset(1);
  b->restore(s);
  auto rest = drain(*b);
  REQUIRE(rest.size() == want1.size() - 9);
  for (size_t i = 0; i < rest.size(); ++i) CHECK(same(rest[i], want1[9 + i]));
}

TEST_CASE("complete file cache answers at(k) without moving next()", "[data][cache][random_access]") {
  auto dir = kiln::test::temp_dir("data-cache-random-access");
  const std::string path = (dir / "c.kcache").string();
  auto p = pipeline("{type = \"cache\", kind = \"file\", path = \"" + path + "\"}", false);
  const auto want = epoch(*p, 0);  // writes the file
  p->reset(1);
  REQUIRE(p->random_access());
  auto first = p->next();
  REQUIRE(first);
  CHECK(same(p->at(150), want[150]));
  CHECK(same(p->at(3), want[3]));
  auto second = p->next();
  REQUIRE(second);
  CHECK(same(*first, want[0]));
  CHECK(same(*second, want[1]));
}
