// Sources of the data plugin (idx, cifar10, csv, synthetic) read small files written here.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;

namespace {

void check_idx_examples(const std::vector<Element>& es, uint32_t first, uint32_t rows, uint32_t cols) {
  for (uint32_t k = 0; k < es.size(); ++k) {
    const uint32_t i = first + k;
    REQUIRE(es[k].batch == 0);
    REQUIRE(es[k].x.shape == Shape({1, rows, cols}));
    REQUIRE(es[k].y.shape == Shape{});
    REQUIRE(es[k].y.data[0] == static_cast<float>(label_of(i)));
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c) REQUIRE(es[k].x.data[r * cols + c] == static_cast<float>(pixel(i, r, c)));
  }
}

}  // namespace

TEST_CASE("idx source reads plain IDX files as (1, rows, cols) floats 0..255 with the label byte", "[data]") {
  auto dir = kiln::test::temp_dir("data-idx");
  auto p = build("stages = [" + write_idx(dir, 37, 4, 5) + "]");
  REQUIRE(p->example_shape() == Shape({1, 4, 5}));
  REQUIRE(p->label_shape() == Shape{});
  REQUIRE(p->size_hint() == 37);
  auto es = drain(*p);
  REQUIRE(es.size() == 37);
  check_idx_examples(es, 0, 4, 5);
  REQUIRE_FALSE(p->next());  // stays at the end
  // A new epoch starts over.
  REQUIRE(same(epoch(*p, 1), es));
}

TEST_CASE("idx source reads gzip files (detected by magic) and takes the first `limit` examples", "[data]") {
  auto dir = kiln::test::temp_dir("data-idx-gz");
  std::string idx = write_idx(dir, 50, 3, 3, /*gzip=*/true);
  idx.insert(idx.size() - 1, ", limit = 20");
  auto p = build("stages = [" + idx + "]");
  REQUIRE(p->size_hint() == 20);
  auto es = drain(*p);
  REQUIRE(es.size() == 20);
  check_idx_examples(es, 0, 3, 3);
}

TEST_CASE("idx source resolves relative paths against the config directory", "[data]") {
  auto dir = kiln::test::temp_dir("data-idx-rel");
  write_idx(dir, 5);
  PipelineOptions o;
  o.base_dir = dir.string();
  auto p = build(R"(stages = [{type = "idx", images = "images", labels = "labels"}])", o);
  REQUIRE(drain(*p).size() == 5);
}

TEST_CASE("idx source reads Debian's Fashion-MNIST test set", "[data]") {
  const std::string d = "/usr/share/datasets/fashion-mnist/";
  if (!std::filesystem::exists(d + "t10k-images-idx3-ubyte.gz")) {
    KILN_SKIP("dataset-fashion-mnist is not installed");
  }
  auto p = build("stages = [{type = \"idx\", images = \"" + d + "t10k-images-idx3-ubyte.gz\", labels = \"" + d +
                 "t10k-labels-idx1-ubyte.gz\"}]");
  REQUIRE(p->size_hint() == 10000);
  REQUIRE(p->example_shape() == Shape({1, 28, 28}));
  auto es = drain(*p);
  REQUIRE(es.size() == 10000);
  std::vector<int> per_class(10, 0);
  for (auto& e : es) {
    REQUIRE(e.y.data[0] >= 0);
    REQUIRE(e.y.data[0] <= 9);
    per_class[static_cast<size_t>(e.y.data[0])]++;
  }
  for (int n : per_class) REQUIRE(n == 1000);  // the test set is balanced
  REQUIRE(es[0].y.data[0] == 9);               // first test image is an ankle boot
}

TEST_CASE("cifar10 source reads label + 3072 pixel records across several files", "[data]") {
  auto dir = kiln::test::temp_dir("data-cifar");
  auto write = [&](const std::string& name, uint32_t n, uint32_t first) {
    std::vector<uint8_t> b;
    for (uint32_t i = first; i < first + n; ++i) {
      b.push_back(label_of(i));
      for (uint32_t k = 0; k < 3072; ++k) b.push_back(static_cast<uint8_t>((i + k * 5) % 256));
    }
    write_bytes(dir / name, b);
  };
  write("a.bin", 3, 0);
  write("b.bin", 4, 3);
  PipelineOptions o;
  o.base_dir = dir.string();
  auto p = build(R"(stages = [{type = "cifar10", files = ["a.bin", "b.bin"]}])", o);
  REQUIRE(p->example_shape() == Shape({3, 32, 32}));
  REQUIRE(p->size_hint() == 7);
  auto es = drain(*p);
  REQUIRE(es.size() == 7);
  for (uint32_t i = 0; i < 7; ++i) {
    REQUIRE(es[i].y.data[0] == label_of(i));
    REQUIRE(es[i].x.data[0] == static_cast<float>(i % 256));
    REQUIRE(es[i].x.data[3071] == static_cast<float>((i + 3071 * 5) % 256));
  }
  // Restoring into the second file lands on the right record.
  p->reset(0);
  drain(*p, 5);
  auto st = p->save();
  auto q = build(R"(stages = [{type = "cifar10", files = ["a.bin", "b.bin"]}])", o);
  q->reset(0);
  q->restore(st);
  auto rest = drain(*q);
  REQUIRE(rest.size() == 2);
  REQUIRE(same(rest[0], es[5]));
  REQUIRE(same(rest[1], es[6]));
}

TEST_CASE("csv source takes the label column by name or index and the other columns as features", "[data]") {
  auto dir = kiln::test::temp_dir("data-csv");
  std::ofstream(dir / "h.csv") << "a,b,target,c\n1,2,0,3\n\n4.5, -5e-1 ,1,6\r\n7,8,2,9\n";
  std::ofstream(dir / "n.csv") << "1;2;3\n4;5;6\n";
  PipelineOptions o;
  o.base_dir = dir.string();

  auto p = build(R"(stages = [{type = "csv", path = "h.csv", header = true, label = "target"}])", o);
  REQUIRE(p->example_shape() == Shape{3});
  REQUIRE(p->size_hint() == 3);
  auto es = drain(*p);
  REQUIRE(es.size() == 3);
  REQUIRE(es[1].x.data == std::vector<float>{4.5f, -0.5f, 6.f});
  REQUIRE(labels(es) == std::vector<float>{0, 1, 2});

  auto q = build(R"(stages = [{type = "csv", path = "n.csv", delimiter = ";", label = 0}])", o);
  auto qs = drain(*q);
  REQUIRE(qs.size() == 2);
  REQUIRE(qs[1].x.data == std::vector<float>{5, 6});
  REQUIRE(labels(qs) == std::vector<float>{1, 4});

  // Default label: the last column. Resume from the middle of the file.
  auto r = build(R"(stages = [{type = "csv", path = "h.csv", header = true}])", o);
  drain(*r, 1);
  auto st = r->save();
  auto r2 = build(R"(stages = [{type = "csv", path = "h.csv", header = true}])", o);
  r2->reset(0);
  r2->restore(st);
  auto rest = drain(*r2);
  REQUIRE(labels(rest) == std::vector<float>{6, 9});
}

TEST_CASE("synthetic source is deterministic from its seed and its classes are separable", "[data]") {
  const std::string cfg =
      R"(stages = [{type = "synthetic", shape = [2, 3, 3], classes = 4, examples = 400, seed = 7}])";
  auto a = build(cfg), b = build(cfg);
  auto ea = drain(*a), eb = drain(*b);
  REQUIRE(ea.size() == 400);
  REQUIRE(ea[0].x.shape == Shape({2, 3, 3}));
  REQUIRE(same(ea, eb));
  auto c = build(R"(stages = [{type = "synthetic", shape = [2, 3, 3], classes = 4, examples = 400, seed = 8}])");
  REQUIRE_FALSE(same(ea, drain(*c)));
  // Nearest class mean (estimated from the first half) classifies the second half well above chance (25%).
  std::vector<std::vector<double>> mean(4, std::vector<double>(18, 0));
  std::vector<int> n(4, 0);
  for (size_t i = 0; i < 200; ++i) {
    auto k = static_cast<size_t>(ea[i].y.data[0]);
    n[k]++;
    for (size_t j = 0; j < 18; ++j) mean[k][j] += ea[i].x.data[j];
  }
  for (size_t k = 0; k < 4; ++k) {
    REQUIRE(n[k] > 20);  // every class occurs
    for (auto& v : mean[k]) v /= n[k];
  }
  int correct = 0;
  for (size_t i = 200; i < 400; ++i) {
    size_t best = 0;
    double bd = 1e30;
    for (size_t k = 0; k < 4; ++k) {
      double d = 0;
      for (size_t j = 0; j < 18; ++j) d += std::pow(ea[i].x.data[j] - mean[k][j], 2);
      if (d < bd) bd = d, best = k;
    }
    correct += best == static_cast<size_t>(ea[i].y.data[0]);
  }
  REQUIRE(correct > 150);
}

TEST_CASE("synthetic source defaults its seed to the run seed", "[data]") {
  const std::string cfg = R"(stages = [{type = "synthetic", shape = [4], examples = 10}])";
  PipelineOptions o1, o2;
  o1.seed = 1;
  o2.seed = 2;
  auto a = build(cfg, o1), b = build(cfg, o1), c = build(cfg, o2);
  auto ea = drain(*a);
  REQUIRE(same(ea, drain(*b)));
  REQUIRE_FALSE(same(ea, drain(*c)));
}
