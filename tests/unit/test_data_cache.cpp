// Cache stage: later epochs read nothing from the source; a file cache is reused across runs and a partial
// or corrupt one is never used.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

std::string cache_pipeline(const std::string& idx, const std::string& cache) {
  return "stages = [" + idx + ", {type = \"scale\"}, " + cache +
         ", {type = \"shuffle\", buffer = 16}, {type = \"batch\", size = 7}]";
}

// Captures what the code under test prints to stderr.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(2);
    tmp_ = std::tmpfile();
    dup2(fileno(tmp_), 2);
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    std::string out;
    std::rewind(tmp_);
    for (int c; (c = std::fgetc(tmp_)) != EOF;) out.push_back(static_cast<char>(c));
    std::fclose(tmp_);
    return out;
  }

 private:
  int saved_ = -1;
  std::FILE* tmp_ = nullptr;
};

}  // namespace

TEST_CASE("memory cache: the second epoch reads nothing from the source and yields the same data", "[data]") {
  auto dir = kiln::test::temp_dir("data-cache-mem");
  std::string idx = write_idx(dir, 50);
  auto ref = build(cache_pipeline(idx, "{type = \"shuffle\", buffer = 1}"));  // same stages, no cache
  auto p = build(cache_pipeline(idx, "{type = \"cache\"}"));
  auto e0 = epoch(*p, 0);
  REQUIRE(stats_of(*p, "idx").elements == 50);
  auto e1 = epoch(*p, 1);
  auto e2 = epoch(*p, 2);
  REQUIRE(stats_of(*p, "idx").elements == 50);  // nothing more was read from the source
  REQUIRE(stats_of(*p, "cache").elements == 150);
  REQUIRE(same(e0, epoch(*ref, 0)));
  REQUIRE(same(e1, epoch(*ref, 1)));  // the shuffle after the cache still reshuffles every epoch
  REQUIRE(same(e2, epoch(*ref, 2)));
  REQUIRE_FALSE(same(e1, e2));
}

TEST_CASE("file cache: written once, then reused by a new pipeline without reading the source", "[data]") {
  auto dir = kiln::test::temp_dir("data-cache-file");
  std::string idx = write_idx(dir, 40);
  const std::string cache =
      "{type = \"cache\", kind = \"file\", path = \"" + (dir / "c" / "train.cache").string() + "\"}";
  auto p = build(cache_pipeline(idx, cache));
  auto e0 = epoch(*p, 0);
  REQUIRE(std::filesystem::exists(dir / "c" / "train.cache"));
  auto e1 = epoch(*p, 1);
  REQUIRE(stats_of(*p, "idx").elements == 40);

  auto q = build(cache_pipeline(idx, cache));
  REQUIRE(same(epoch(*q, 0), e0));
  REQUIRE(same(epoch(*q, 1), e1));
  REQUIRE(stats_of(*q, "idx").elements == 0);  // served entirely from the file
  // No temp file is left behind.
  for (auto& f : std::filesystem::directory_iterator(dir / "c")) REQUIRE(f.path().filename() == "train.cache");
}

TEST_CASE("file cache: a truncated, corrupt or half-written cache is rebuilt from the source with a warning",
          "[data]") {
  auto dir = kiln::test::temp_dir("data-cache-bad");
  std::string idx = write_idx(dir, 30);
  auto path = dir / "train.cache";
  const std::string cache = "{type = \"cache\", kind = \"file\", path = \"" + path.string() + "\"}";
  auto good = epoch(*build(cache_pipeline(idx, cache)), 0);
  const auto full = std::filesystem::file_size(path);

  auto check_rebuilt = [&](const std::string& why) {
    StderrCapture cap;
    auto p = build(cache_pipeline(idx, cache));
    std::string err = cap.finish();
    INFO(why);
    REQUIRE_THAT(err, Catch::Contains("warning") && Catch::Contains(path.string()) && Catch::Contains("rebuilding"));
    REQUIRE(same(epoch(*p, 0), good));
    REQUIRE(stats_of(*p, "idx").elements == 30);  // it read the source again
    REQUIRE(std::filesystem::file_size(path) == full);
  };

  // Truncated (as if the writer died mid-way without the temp-file protocol).
  std::filesystem::resize_file(path, full - 50);
  check_rebuilt("truncated");

  // One flipped byte in the payload: the checksum catches it.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(full - 10));
    f.put('\x7f');
  }
  check_rebuilt("corrupt payload");

  // A header claiming more elements than the file has.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    uint64_t n = 31;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  check_rebuilt("header count");

  // A half-written temp file from a crashed run is ignored: only the completed file counts.
  std::filesystem::remove(path);
  { std::ofstream(path.string() + ".tmp.12345") << "KILNCAC1 partial"; }
  auto p = build(cache_pipeline(idx, cache));
  REQUIRE(same(epoch(*p, 0), good));
  REQUIRE(stats_of(*p, "idx").elements == 30);
}

TEST_CASE("file cache built for other shapes is not used", "[data]") {
  auto dir = kiln::test::temp_dir("data-cache-shape");
  auto path = dir / "x.cache";
  std::string cache = "{type = \"cache\", kind = \"file\", path = \"" + path.string() + "\"}";
  epoch(*build(R"(stages = [{type = "synthetic", shape = [3], examples = 10}, )" + cache + "]"), 0);
  StderrCapture cap;
  auto p = build(R"(stages = [{type = "synthetic", shape = [4], examples = 10}, )" + cache + "]");
  REQUIRE_THAT(cap.finish(), Catch::Contains("other element shapes"));
  auto es = epoch(*p, 0);
  REQUIRE(es[0].x.shape == Shape{4});
}
