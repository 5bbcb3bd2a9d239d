// Cache stage: later epochs read nothing from the source; a file cache is reused across runs and a partial
// or corrupt one is never used. A file cache only ever replaces a Kiln cache: whatever else sits at its `path` (a
// user's file, the training data itself, a device node, a directory, a FIFO) is left exactly as it was and the config
// is refused naming the key and the path; a stale Kiln cache is rebuilt.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;
namespace fs = std::filesystem;

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
  if (::geteuid() != 0)
    KILN_SKIP("creating a device node needs root and CAP_MKNOD; this process runs as uid " << ::geteuid());
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    const int err = errno;
    KILN_SKIP("creating a device node needs CAP_MKNOD: mknod " << node.string() << ": " << std::strerror(err));
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
