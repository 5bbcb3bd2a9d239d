// Bad data raises DataError naming the file and where in it; nothing hangs.
#include <catch2/catch.hpp>
#include <fstream>

#include "kiln/error.hpp"
#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

// The DataError message of building and draining `stages`, or "" if none was thrown.
std::string data_error(const std::string& stages, const std::string& base_dir = {}) {
  PipelineOptions o;
  o.base_dir = base_dir;
  try {
    auto p = build("stages = [" + stages + "]", o);
    drain(*p);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::string idx_cfg(const std::filesystem::path& images, const std::filesystem::path& labels) {
  return "{type = \"idx\", images = \"" + images.string() + "\", labels = \"" + labels.string() + "\"}";
}

}  // namespace

TEST_CASE("idx: a missing file is a DataError naming it", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-missing");
  write_idx(dir, 4);
  auto msg = data_error(idx_cfg(dir / "nope", dir / "labels"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "nope").string()) && Catch::Contains("No such file"));
}

TEST_CASE("idx: a wrong magic number is a DataError naming the file, offset and both magics", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-magic");
  write_idx(dir, 4);
  // Swapped images and labels.
  auto msg = data_error(idx_cfg(dir / "labels", dir / "images"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "labels").string()) && Catch::Contains("0x00000803") &&
                        Catch::Contains("0x00000801") && Catch::Contains("offset 0"));
}

TEST_CASE("idx: a file shorter or longer than its header says is a DataError with both sizes", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-size");
  auto img = idx_images(10, 4, 5);  // 16 + 200 bytes
  auto short_img = img;
  short_img.resize(img.size() - 7);
  write_bytes(dir / "short", short_img);
  write_bytes(dir / "labels", idx_labels(10));
  auto msg = data_error(idx_cfg(dir / "short", dir / "labels"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "short").string()) && Catch::Contains("216") && Catch::Contains("209"));

  auto long_img = img;
  long_img.push_back(1);
  write_bytes(dir / "long", long_img);
  msg = data_error(idx_cfg(dir / "long", dir / "labels"));
  REQUIRE_THAT(msg, Catch::Contains("217") && Catch::Contains("trailing"));

  // The same for gzip files, whose uncompressed length is checked.
  write_bytes(dir / "short.gz", short_img, true);
  msg = data_error(idx_cfg(dir / "short.gz", dir / "labels"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "short.gz").string()) && Catch::Contains("216"));
}

TEST_CASE("idx: a gzip file cut short is a DataError, not a hang or a short epoch", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-gzcut");
  write_idx(dir, 500, 8, 8, true);
  std::ifstream in(dir / "images.gz", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  bytes.resize(bytes.size() / 2);
  std::ofstream(dir / "cut.gz", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto msg = data_error(idx_cfg(dir / "cut.gz", dir / "labels.gz"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "cut.gz").string()));
}

TEST_CASE("idx: images and labels of different counts is a DataError naming both files", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-count");
  write_bytes(dir / "images", idx_images(10, 2, 2));
  write_bytes(dir / "labels", idx_labels(9));
  auto msg = data_error(idx_cfg(dir / "images", dir / "labels"));
  REQUIRE_THAT(msg, Catch::Contains((dir / "images").string()) && Catch::Contains((dir / "labels").string()) &&
                        Catch::Contains("10 images") && Catch::Contains("9 labels"));
}

TEST_CASE("an empty source (IDX count 0, CSV with only a header) is a DataError, not an endless empty epoch",
          "[data]") {
  auto dir = kiln::test::temp_dir("data-err-empty");
  write_bytes(dir / "images", idx_images(0, 2, 2));
  write_bytes(dir / "labels", idx_labels(0));
  REQUIRE_THAT(data_error(idx_cfg(dir / "images", dir / "labels")), Catch::Contains("no examples"));
  std::ofstream(dir / "h.csv") << "a,b\n";
  REQUIRE_THAT(data_error(R"({type = "csv", path = "h.csv", header = true})", dir.string()),
               Catch::Contains("h.csv") && Catch::Contains("no data rows"));
}

TEST_CASE("cifar10: a file whose length is not a multiple of 3073 is a DataError naming it", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-cifar");
  write_bytes(dir / "bad.bin", std::vector<uint8_t>(3073 * 2 + 100, 1));
  auto msg = data_error(R"({type = "cifar10", files = ["bad.bin"]})", dir.string());
  REQUIRE_THAT(msg, Catch::Contains("bad.bin") && Catch::Contains("6246") && Catch::Contains("3073"));
  // A label byte outside 0..9 names the record and offset.
  std::vector<uint8_t> rec(3073 * 2, 0);
  rec[3073] = 17;
  write_bytes(dir / "label.bin", rec);
  msg = data_error(R"({type = "cifar10", files = ["label.bin"]})", dir.string());
  REQUIRE_THAT(msg, Catch::Contains("record 1") && Catch::Contains("offset 3073") && Catch::Contains("17"));
}

TEST_CASE("csv: a non-number field is a DataError naming the file, line and column", "[data]") {
  auto dir = kiln::test::temp_dir("data-err-csv");
  std::ofstream(dir / "a.csv") << "x,y,label\n1,2,0\n3,abc,1\n";
  auto msg = data_error(R"({type = "csv", path = "a.csv", header = true})", dir.string());
  REQUIRE_THAT(msg, Catch::Contains("a.csv") && Catch::Contains("line 3") && Catch::Contains("column 2") &&
                        Catch::Contains("abc"));
  std::ofstream(dir / "b.csv") << "1,2,0\n3,4\n";
  msg = data_error(R"({type = "csv", path = "b.csv"})", dir.string());
  REQUIRE_THAT(msg, Catch::Contains("line 2") && Catch::Contains("expected 3 columns, found 2"));
  msg = data_error(R"({type = "csv", path = "a.csv", header = true, label = "target"})", dir.string());
  REQUIRE_THAT(msg, Catch::Contains("target") && Catch::Contains("x, y, label"));
}

TEST_CASE("a data error inside map workers or behind prefetch surfaces in next() and leaves no thread behind",
          "[data]") {
  auto dir = kiln::test::temp_dir("data-err-threads");
  // Labels go up to 9; one_hot with 5 classes fails on the first label >= 5, inside a worker thread.
  std::string idx = write_idx(dir, 200, 2, 2);
  for (int round = 0; round < 5; ++round) {
    auto p = build("stages = [" + idx + R"(, {type = "map", workers = 4, ops = [{op = "one_hot", classes = 5}]},
                                            {type = "batch", size = 8}, {type = "prefetch", depth = 2}])");
    REQUIRE_THROWS_AS(drain(*p), DataError);
    REQUIRE_THROWS_AS(p->next(), DataError);  // stays failed until reset
  }
}

TEST_CASE("restoring a state saved by a different pipeline is a DataError naming the stage", "[data]") {
  auto a = build(R"(stages = [{type = "synthetic", shape = [2], examples = 10}, {type = "shuffle", buffer = 4}])");
  auto b = build(R"(stages = [{type = "synthetic", shape = [2], examples = 10}, {type = "batch", size = 2}])");
  auto st = a->save();
  b->reset(0);
  try {
    b->restore(st);
    FAIL("restore accepted a foreign state");
  } catch (const DataError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("shuffle") && Catch::Contains("batch"));
  }
  StageState truncated(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(st.size() - 3));
  a->reset(0);
  REQUIRE_THROWS_AS(a->restore(truncated), DataError);
}
