// Exact resume: save after k batches, build a new pipeline, reset to the same epoch, restore, and the remaining
// batches equal those of an uninterrupted run. Also: worker count does not change the data.
#include <catch2/catch.hpp>
#include <fstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

// Runs epochs 0..2 uninterrupted, then for every epoch and several cut points checks a resumed run.
void check_resume(const std::string& cfg, const std::vector<size_t>& cuts) {
  auto ref = build(cfg);
  std::vector<std::vector<Element>> want;
  for (uint64_t e = 0; e < 3; ++e) want.push_back(epoch(*ref, e));
  REQUIRE(want[0].size() > 3);
  REQUIRE_FALSE(same(want[0], want[1]));
  for (uint64_t e = 0; e < 3; ++e)
    for (size_t k : cuts) {
      if (k > want[e].size()) continue;
      INFO("epoch " << e << ", saved after " << k << " batches");
      // The interrupted run: previous epochs, then k batches of epoch e, then save.
      auto run = build(cfg);
      for (uint64_t p = 0; p < e; ++p) epoch(*run, p);
      run->reset(e);
      auto head = drain(*run, k);
      StageState st = run->save();
      // Saving does not disturb the running pipeline.
      auto tail_same_run = drain(*run);
      // The resumed run: a fresh pipeline, reset to the epoch, restore.
      auto resumed = build(cfg);
      resumed->reset(e);
      resumed->restore(st);
      auto tail = drain(*resumed);
      std::vector<Element> expect(want[e].begin() + static_cast<std::ptrdiff_t>(k), want[e].end());
      REQUIRE(same(std::vector<Element>(want[e].begin(), want[e].begin() + static_cast<std::ptrdiff_t>(k)), head));
      REQUIRE(same(tail_same_run, expect));
      REQUIRE(same(tail, expect));
      // And the epoch after the resumed one is the uninterrupted run's too.
      if (e + 1 < 3) REQUIRE(same(epoch(*resumed, e + 1), want[e + 1]));
    }
}

}  // namespace

TEST_CASE("resume mid-epoch: idx(gzip) > map(random, 2 workers) > shuffle > batch > prefetch", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-1");
  std::string idx = write_idx(dir, 61, 6, 6, true);
  check_resume("stages = [" + idx + R"(,
      {type = "map", workers = 2, ops = [{op = "scale", factor = 0.00392156862745098},
                                         {op = "random_crop", size = [6, 6], padding = 2},
                                         {op = "flip_horizontal"}, {op = "one_hot", classes = 10}]},
      {type = "shuffle", buffer = 20}, {type = "batch", size = 6}, {type = "prefetch", depth = 2}])",
               {0, 1, 4, 10, 11});
}

TEST_CASE("resume mid-epoch: a map with read-ahead (3 workers) after a shuffle keeps its buffered elements", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-2");
  std::string idx = write_idx(dir, 500, 3, 3);
  check_resume("stages = [" + idx + R"(, {type = "shuffle", buffer = 50},
      {type = "map", workers = 3, ops = [{op = "flip_horizontal"}, {op = "standardize"}]},
      {type = "batch", size = 16}])",
               {0, 3, 20, 31});
}

TEST_CASE("resume mid-epoch with a memory cache, while filling and while serving", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-3");
  std::string idx = write_idx(dir, 45);
  check_resume("stages = [" + idx + R"(, {type = "scale"}, {type = "cache"}, {type = "shuffle", buffer = 10},
      {type = "batch", size = 4}, {type = "prefetch", depth = 3}])",
               {0, 2, 7, 12});
  // Cache directly under batch: the cache's own save/restore (no shuffle replay above it).
  check_resume("stages = [" + idx + R"(, {type = "cache"}, {type = "map", ops = [{op = "flip_horizontal"}]},
      {type = "batch", size = 4}, {type = "prefetch"}])",
               {0, 3, 11, 12});
}

TEST_CASE("resume while a file cache is being written: the resumed run completes a valid cache", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-fill");
  std::string idx = write_idx(dir, 30);
  const std::string cfg = "stages = [" + idx + R"(, {type = "cache", kind = "file", path = ")" +
                          (dir / "f.cache").string() + R"("}, {type = "batch", size = 4}])";
  auto want = epoch(*build(cfg), 0);
  std::filesystem::remove(dir / "f.cache");
  auto run = build(cfg);
  run->reset(0);
  drain(*run, 3);
  auto st = run->save();
  run.reset();  // the interrupted process goes away mid-write
  REQUIRE_FALSE(std::filesystem::exists(dir / "f.cache"));
  auto resumed = build(cfg);
  resumed->reset(0);
  resumed->restore(st);
  auto tail = drain(*resumed);
  REQUIRE(same(tail, std::vector<Element>(want.begin() + 3, want.end())));
  REQUIRE(std::filesystem::exists(dir / "f.cache"));
  auto fresh = build(cfg);
  REQUIRE(same(epoch(*fresh, 0), want));
  REQUIRE(stats_of(*fresh, "idx").elements == 0);  // the completed cache is valid and used
}

TEST_CASE("resume mid-epoch with a file cache", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-4");
  std::string idx = write_idx(dir, 45);
  check_resume("stages = [" + idx + R"(, {type = "cache", kind = "file", path = ")" + (dir / "c.cache").string() +
                   R"("}, {type = "map", ops = [{op = "flip_horizontal"}]}, {type = "shuffle", buffer = 10},
      {type = "batch", size = 4}])",
               {0, 5, 12});
}

TEST_CASE("resume mid-epoch: csv and synthetic sources", "[data]") {
  auto dir = kiln::test::temp_dir("data-resume-5");
  {
    std::ofstream f(dir / "d.csv");
    f << "a,b,c\n";
    for (int i = 0; i < 37; ++i) f << i << "," << i * 0.5 << "," << i % 3 << "\n";
  }
  check_resume("stages = [{type = \"csv\", path = \"" + (dir / "d.csv").string() +
                   "\", header = true}, {type = \"shuffle\", buffer = 8}, {type = \"batch\", size = 5}]",
               {0, 3, 7});
  check_resume(R"(stages = [{type = "synthetic", shape = [3], examples = 30}, {type = "shuffle", buffer = 7},
                            {type = "batch", size = 4}, {type = "prefetch"}])",
               {1, 6});
}

TEST_CASE("the whole pipeline gives identical batches with 1, 2 and 4 map workers", "[data]") {
  auto dir = kiln::test::temp_dir("data-workers");
  std::string idx = write_idx(dir, 300, 8, 8);
  auto make = [&](int w) {
    return build(
        "stages = [" + idx + R"(, {type = "map", workers = )" + std::to_string(w) +
        R"(, ops = [{op = "scale", factor = 0.00392156862745098}, {op = "random_crop", size = [8, 8], padding = 3},
                             {op = "flip_horizontal"}]},
                 {type = "shuffle", buffer = 100}, {type = "batch", size = 32}, {type = "prefetch", depth = 2}])");
  };
  auto p1 = make(1), p2 = make(2), p4 = make(4);
  for (uint64_t e = 0; e < 2; ++e) {
    auto b1 = epoch(*p1, e);
    REQUIRE(b1.size() == 10);
    REQUIRE(same(b1, epoch(*p2, e)));
    REQUIRE(same(b1, epoch(*p4, e)));
  }
}
