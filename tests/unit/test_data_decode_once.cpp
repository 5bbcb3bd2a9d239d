// Sources decode once per run: within [data] decoded_budget a source keeps its decoded examples in memory and serves
// every epoch from there, giving exactly the elements, order and resume positions of streaming; beyond it, it streams.
// Also: at(k) is the k-th element in both modes, bytes_read counts what is read, and reading() says which mode.
#include <catch2/catch.hpp>
#include <thread>

#include "kiln/session.hpp"
#include "test_data_support.hpp"

using namespace kiln;
using namespace kiln::test::data;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kLots = uint64_t{1} << 30;  // a budget every test set fits

struct Built {
  std::unique_ptr<Stage> top;
  Stage* source = nullptr;
};

// Builds `stages = [...]` as the host does, handing the source `budget` (StageContext::decoded_budget).
Built build_with(const std::string& stages_toml, uint64_t budget, uint64_t seed = 42) {
  Config cfg = Config::load_string(stages_toml, "pipeline.toml");
  Built b;
  for (auto& s : cfg.root().table_array("stages")) {
    StageContext ctx;
    ctx.upstream = std::move(b.top);
    ctx.seed = seed;
    ctx.global_batch = 4;
    ctx.decoded_budget = budget;
    const bool source = !ctx.upstream;
    b.top = kiln::test::registry().stage(s.get_string("type"))(s, std::move(ctx));
    if (source) b.source = b.top.get();
  }
  return b;
}

std::string stages(const std::string& source, const std::string& rest = "") {
  return "stages = [" + source + (rest.empty() ? "" : ", " + rest) + "]\n";
}

uint64_t bytes_read(const Stage& s) {
  std::vector<StageStats> all;
  s.collect_stats(all);
  REQUIRE(!all.empty());
  return all.front().bytes_read;  // the source's
}

// One of each file source, written under `dir`: (name, stage TOML).
std::vector<std::pair<std::string, std::string>> write_sources(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  fs::create_directories(dir / "gz");
  out.emplace_back("idx gzip", write_idx(dir / "gz", 23, 4, 5, /*gzip=*/true));
  fs::create_directories(dir / "plain");
  out.emplace_back("idx plain", write_idx(dir / "plain", 23, 4, 5, /*gzip=*/false));
  // Two CIFAR-10 files of 7 and 6 records.
  for (int f = 0; f < 2; ++f) {
    std::vector<uint8_t> b;
    for (uint32_t i = 0; i < static_cast<uint32_t>(7 - f); ++i) {
      b.push_back(label_of(i + 7 * f));
      for (uint32_t p = 0; p < 3072; ++p) b.push_back(pixel(i + 7 * f, p / 32, p % 32));
    }
    write_bytes(dir / ("c" + std::to_string(f) + ".bin"), b);
  }
  out.emplace_back("cifar10", "{type = \"cifar10\", files = [\"" + (dir / "c0.bin").string() + "\", \"" +
                                  (dir / "c1.bin").string() + "\"]}");
  // One row per line, \r\n endings, blank lines between some rows.
  std::string csv = "a,b,label\n";
  for (int i = 0; i < 19; ++i)
    csv += std::to_string(i) + ".5, " + std::to_string(i * i) + "," + std::to_string(i % 3) + "\r\n" +
           (i % 5 == 0 ? "\n" : "");
  write_bytes(dir / "t.csv.gz", std::vector<uint8_t>(csv.begin(), csv.end()), /*gzip=*/true);
  out.emplace_back("csv", "{type = \"csv\", path = \"" + (dir / "t.csv.gz").string() + "\", header = true}");
  std::vector<uint8_t> tok;
  for (int i = 0; i < 300; ++i) {
    const uint16_t id = static_cast<uint16_t>((i * 37) % 1000);
    tok.push_back(static_cast<uint8_t>(id & 0xff));
    tok.push_back(static_cast<uint8_t>(id >> 8));
  }
  write_bytes(dir / "train.bin", tok);
  out.emplace_back("tokens", "{type = \"tokens\", path = \"" + (dir / "train.bin").string() +
                                 "\", vocab_size = 1000, block_size = 8, examples_per_epoch = 21}");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "to be or not to be, " + std::to_string(i) + "\n";
  write_bytes(dir / "t.txt", std::vector<uint8_t>(text.begin(), text.end()));
  out.emplace_back("text", "{type = \"text\", path = \"" + (dir / "t.txt").string() +
                               "\", block_size = 8, examples_per_epoch = 17}");
  out.emplace_back("text val bytes", "{type = \"text\", path = \"" + (dir / "t.txt").string() +
                                         "\", vocab = \"bytes\", split = \"val\", block_size = 8, sampling = "
                                         "\"sequential\"}");
  // Characters of several bytes: no window offsets in the file, so this one is held in memory in both modes.
  std::string utf8;
  for (int i = 0; i < 40; ++i) utf8 += "na\xc3\xafve caf\xc3\xa9 " + std::to_string(i) + "\n";
  write_bytes(dir / "u.txt", std::vector<uint8_t>(utf8.begin(), utf8.end()));
  out.emplace_back("text utf8", "{type = \"text\", path = \"" + (dir / "u.txt").string() +
                                    "\", block_size = 8, examples_per_epoch = 17}");
  return out;
}

}  // namespace

TEST_CASE("decoded and streaming sources give bit-identical shuffled batches over two epochs", "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-identical");
  for (const auto& [what, src] : write_sources(dir)) {
    INFO(what);
    const std::string toml = stages(src, "{type = \"shuffle\", buffer = 5}, {type = \"batch\", size = 4}");
    Built dec = build_with(toml, kLots), str = build_with(toml, 0);
    CHECK_THAT(dec.source->reading(), Catch::StartsWith("decoded"));
    if (what != "text utf8")
      CHECK_THAT(str.source->reading(), Catch::StartsWith("streaming"));
    else
      CHECK_THAT(str.source->reading(), Catch::StartsWith("decoded at build") && Catch::Contains("off"));
    CHECK(dec.source->vocabulary() == str.source->vocabulary());
    for (uint64_t e = 0; e < 2; ++e) {
      auto a = epoch(*dec.top, e), b = epoch(*str.top, e);
      CHECK(!a.empty());
      CHECK(same(a, b));
    }
  }
}

TEST_CASE("a decoded source resumes mid-epoch exactly, and positions carry across modes", "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-resume");
  for (const auto& [what, src] : write_sources(dir)) {
    const std::string toml = stages(src, "{type = \"shuffle\", buffer = 6}, {type = \"batch\", size = 4}");
    const auto full = epoch(*build_with(toml, kLots).top, 1);
    for (size_t cut : {size_t{1}, full.size() / 2, full.size() - 1})
      for (auto [save_budget, restore_budget] : {std::pair<uint64_t, uint64_t>{kLots, kLots}, {kLots, 0}, {0, kLots}}) {
        INFO(what << ", cut after " << cut << " batches, saved " << (save_budget ? "decoded" : "streaming")
                  << ", restored " << (restore_budget ? "decoded" : "streaming"));
        Built a = build_with(toml, save_budget);
        a.top->reset(1);
        auto head = drain(*a.top, cut);
        StageState st = a.top->save();
        Built b = build_with(toml, restore_budget);
        b.top->reset(1);
        b.top->restore(st);
        auto tail = drain(*b.top);
        head.insert(head.end(), tail.begin(), tail.end());
        CHECK(same(head, full));
      }
  }
}

TEST_CASE("a decoded source reads its files once, then nothing more in later epochs or on restore", "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-bytes");
  const std::string src = write_idx(dir, 10, 4, 5, /*gzip=*/true);
  const uint64_t payload = 10 * 20 + 10;  // pixels + labels, uncompressed
  Built dec = build_with(stages(src), kLots);
  const uint64_t at_build = bytes_read(*dec.source);
  CHECK(at_build < payload);  // headers only: decoding waits for the first read
  epoch(*dec.top, 0);
  const uint64_t after_one = bytes_read(*dec.source);
  CHECK(after_one >= at_build + payload);
  epoch(*dec.top, 1);
  dec.top->reset(2);
  drain(*dec.top, 7);
  const StageState st = dec.top->save();
  dec.top->reset(2);
  dec.top->restore(st);
  CHECK(drain(*dec.top).size() == 3);
  CHECK(bytes_read(*dec.source) == after_one);

  Built str = build_with(stages(src), 0);
  const uint64_t s0 = bytes_read(*str.source);
  epoch(*str.top, 0);
  const uint64_t s1 = bytes_read(*str.source);
  CHECK(s1 - s0 >= payload);
  epoch(*str.top, 1);
  CHECK(bytes_read(*str.source) - s1 >= payload);  // streaming reads the files again every epoch
}

TEST_CASE("a budget smaller than the decoded set streams, and reading() says so", "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-budget");
  const std::string src = write_idx(dir, 10, 4, 5);  // decoded: 10 x (20 + 1) = 210 bytes
  Built small = build_with(stages(src), 209);
  CHECK_THAT(small.source->reading(), Catch::StartsWith("streaming: decoded set 210 B exceeds the budget 209 B"));
  CHECK_THAT(small.source->reading(), Catch::Contains("[data] decoded_budget"));
  Built exact = build_with(stages(src), 210);
  CHECK_THAT(exact.source->reading(), Catch::StartsWith("decoded once: 210 B in memory"));
  Built off = build_with(stages(src), 0);
  CHECK_THAT(off.source->reading(), Catch::StartsWith("streaming"));
  CHECK_THAT(off.source->reading(), Catch::Contains("off"));
  // Streaming, an epoch reads the examples again: bytes_read grows by at least their 210 bytes per epoch.
  epoch(*small.top, 0);
  const uint64_t b1 = bytes_read(*small.source);
  epoch(*small.top, 1);
  CHECK(bytes_read(*small.source) - b1 >= 210);
  CHECK(same(epoch(*small.top, 1), epoch(*exact.top, 1)));
}

TEST_CASE("at(k) is the k-th element of the epoch in both modes, from several threads, without moving next()",
          "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-at");
  for (const auto& [what, src] : write_sources(dir))
    for (uint64_t budget : {kLots, uint64_t{0}}) {
      INFO(what << (budget ? ", decoded" : ", streaming"));
      Built b = build_with(stages(src), budget);
      Stage& s = *b.source;
      const bool expect =
          budget > 0 || what == "idx plain" || what == "cifar10" || what == "tokens" || what.rfind("text", 0) == 0;
      CHECK(s.random_access() == expect);
      if (!s.random_access()) {
        CHECK_THROWS(s.at(0));
        continue;
      }
      const auto all = epoch(s, 1);  // epoch 1: windows are drawn per epoch
      s.reset(1);
      auto first = s.next();
      REQUIRE(first);
      const uint64_t before = bytes_read(s);
      // Every element from 4 threads at once (a decoded source decodes on the first of them).
      std::vector<std::vector<Element>> got(4, std::vector<Element>(all.size()));
      std::vector<std::thread> threads;
      for (size_t t = 0; t < got.size(); ++t)
        threads.emplace_back([&, t] {
          for (size_t k = 0; k < all.size(); ++k) got[t][k] = s.at(k);
        });
      for (auto& t : threads) t.join();
      for (const auto& g : got) CHECK(same(g, all));
      if (budget == 0 && what != "text utf8") CHECK(bytes_read(s) > before);  // preads are counted
      auto second = s.next();
      REQUIRE(second);
      CHECK(same(*first, all[0]));
      CHECK(same(*second, all[1]));
      CHECK_THROWS_AS(s.at(all.size()), Error);
    }
}

TEST_CASE("[data] decoded_budget: auto, off, sizes and bad values", "[data][decode]") {
  const fs::path dir = kiln::test::temp_dir("decode-session");
  const std::string src = write_idx(dir, 10, 4, 5);
  auto config = [&](const std::string& budget_line) {
    return "[model]\ninput_shape = [1, 4, 5]\n[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = "
           "\"dense\"\nunits = 10\n[data]\n" +
           budget_line + "\n[data.train]\n" + stages(src) + "[data.test]\n" + stages(src);
  };
  auto& reg = kiln::test::registry();
  {
    Session s(Config::load_string(config(""), "run.toml"), reg);  // default: "auto"
    CHECK(s.decoded_budget() > 0);
    CHECK_THAT(s.source_reading("train"), Catch::StartsWith("decoded once: 210 B in memory"));
    CHECK_THAT(s.source_reading("test"), Catch::StartsWith("decoded once"));
  }
  {
    Session s(Config::load_string(config("decoded_budget = \"off\""), "run.toml"), reg);
    CHECK(s.decoded_budget() == 0);
    CHECK_THAT(s.source_reading("train"), Catch::StartsWith("streaming"));
  }
  {
    Session s(Config::load_string(config("decoded_budget = \"1KiB\""), "run.toml"), reg);
    CHECK(s.decoded_budget() == 1024);
    Session t(Config::load_string(config("decoded_budget = 100"), "run.toml"), reg);
    CHECK(t.decoded_budget() == 100);
    CHECK_THAT(t.source_reading("train"), Catch::Contains("exceeds the budget 100 B"));
  }
  for (const char* bad : {"decoded_budget = \"lots\"", "decoded_budget = \"-5MiB\"", "decoded_budget = \"12 parsecs\"",
                          "decoded_budget = true"}) {
    INFO(bad);
    std::string msg;
    try {
      Session s(Config::load_string(config(bad), "run.toml"), reg);
    } catch (const ConfigError& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Catch::Contains("decoded_budget"));
    CHECK_THAT(msg, Catch::Contains("run.toml"));
  }
}
