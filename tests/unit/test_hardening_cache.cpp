// Hardening (issue 15): the file cache only ever replaces a Kiln cache. Whatever else sits at its `path` (a user's
// file, the training data itself, a device node, a directory, a FIFO) is left exactly as it was and the config is
// refused naming the key and the path; a stale Kiln cache is rebuilt.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;
namespace fs = std::filesystem;

namespace {

std::string pipeline(const std::string& idx, const fs::path& cache) {
  return "stages = [" + idx + ", {type = \"cache\", kind = \"file\", path = \"" + cache.string() +
         "\"}, {type = \"batch\", size = 8}]";
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Building the pipeline must fail with a ConfigError naming the key `path`, the path and what is wrong.
void require_refused(const std::string& toml, const fs::path& target, const std::string& what) {
  try {
    build(toml);
    FAIL("the cache accepted " << target << ", which " << what);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE_THAT(msg, Catch::Contains("path") && Catch::Contains(target.string()) && Catch::Contains(what) &&
                          Catch::Contains("choose another path"));
  }
}

}  // namespace

TEST_CASE("file cache refuses to overwrite a user's text file and leaves it byte-for-byte unchanged", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-text");
  std::string idx = write_idx(dir, 20);
  const fs::path notes = dir / "notes.txt";
  const std::string text = "my experiment notes\nline two\n";
  { std::ofstream(notes, std::ios::binary) << text; }
  require_refused(pipeline(idx, notes), notes, "is not a Kiln cache file");
  REQUIRE(read_all(notes) == text);
  // An empty file is not a cache either.
  const fs::path empty = dir / "empty";
  { std::ofstream(empty.string()); }
  require_refused(pipeline(idx, empty), empty, "is not a Kiln cache file");
  REQUIRE(fs::file_size(empty) == 0);
}

TEST_CASE("file cache refuses a path that is the training data file itself", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-data");
  std::string idx = write_idx(dir, 20);
  const fs::path labels = dir / "labels";
  const std::string before = read_all(labels);
  require_refused(pipeline(idx, labels), labels, "is not a Kiln cache file");
  REQUIRE(read_all(labels) == before);
  // The data still reads as before.
  REQUIRE(drain(*build("stages = [" + idx + "]")).size() == 20);
}

TEST_CASE("file cache refuses a device node, which stays a character device", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-dev");
  std::string idx = write_idx(dir, 20);
  // A private copy of /dev/null (same major/minor), so a regression cannot damage the machine's /dev/null.
  const fs::path node = dir / "null";
  if (::geteuid() != 0 || ::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    WARN("skipped: creating a device node needs root and CAP_MKNOD");
    return;
  }
  require_refused(pipeline(idx, node), node, "is a device node");
  struct stat st {};
  REQUIRE(::lstat(node.c_str(), &st) == 0);
  REQUIRE(S_ISCHR(st.st_mode));
  REQUIRE(major(st.st_rdev) == 1);
  REQUIRE(minor(st.st_rdev) == 3);
  // The real /dev/null is refused the same way (checked before anything is written).
  require_refused(pipeline(idx, "/dev/null"), "/dev/null", "is a device node");
  REQUIRE(::lstat("/dev/null", &st) == 0);
  REQUIRE(S_ISCHR(st.st_mode));
}

TEST_CASE("file cache refuses a directory, a FIFO and a dangling symbolic link", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-dir");
  std::string idx = write_idx(dir, 20);
  const fs::path sub = dir / "sub";
  fs::create_directories(sub / "inner");
  require_refused(pipeline(idx, sub), sub, "is a directory");
  REQUIRE(fs::is_directory(sub / "inner"));

  const fs::path fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  require_refused(pipeline(idx, fifo), fifo, "is a FIFO");  // and does not block opening it
  REQUIRE(fs::is_fifo(fifo));

  const fs::path link = dir / "dangling";
  fs::create_symlink(dir / "nowhere", link);
  require_refused(pipeline(idx, link), link, "symbolic link");
  REQUIRE(fs::is_symlink(link));
}

TEST_CASE("file cache: a stale Kiln cache (other upstream data) is rebuilt atomically from the source", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-stale");
  const fs::path cache = dir / "train.cache";
  auto small_dir = dir / "small", big_dir = dir / "big";
  fs::create_directories(small_dir);
  fs::create_directories(big_dir);
  std::string small = write_idx(small_dir, 24), big = write_idx(big_dir, 40);
  epoch(*build(pipeline(small, cache)), 0);
  const auto small_size = fs::file_size(cache);

  auto reference = epoch(*build("stages = [" + big + ", {type = \"batch\", size = 8}]"), 0);
  auto p = build(pipeline(big, cache));  // the cache holds 24 examples, the upstream 40: stale
  auto e0 = epoch(*p, 0);
  REQUIRE(same(e0, reference));
  REQUIRE(stats_of(*p, "idx").elements == 40);
  REQUIRE(fs::file_size(cache) > small_size);
  for (auto& f : fs::directory_iterator(dir)) REQUIRE(f.path().filename().string().find(".tmp.") == std::string::npos);

  // The rebuilt cache is reused: a new pipeline reads nothing from the source.
  auto q = build(pipeline(big, cache));
  REQUIRE(same(epoch(*q, 0), reference));
  REQUIRE(stats_of(*q, "idx").elements == 0);
}

TEST_CASE("file cache: a file that appears at the path while the cache is filled is not replaced", "[data]") {
  auto dir = kiln::test::temp_dir("hard-cache-race");
  std::string idx = write_idx(dir, 24);
  const fs::path cache = dir / "late.cache";
  auto p = build(pipeline(idx, cache));
  p->reset(0);
  REQUIRE(p->next());  // filling has started; nothing at the path yet
  const std::string text = "written by someone else meanwhile\n";
  { std::ofstream(cache, std::ios::binary) << text; }
  try {
    drain(*p);
    FAIL("the cache replaced a file that is not a Kiln cache");
  } catch (const DataError& e) {
    INFO(e.what());
    REQUIRE_THAT(std::string(e.what()), Catch::Contains(cache.string()) && Catch::Contains("not a Kiln cache"));
  }
  REQUIRE(read_all(cache) == text);
  for (auto& f : fs::directory_iterator(dir)) REQUIRE(f.path().filename().string().find(".tmp.") == std::string::npos);
}
