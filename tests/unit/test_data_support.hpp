// Helpers for the data-stage tests: build a pipeline from TOML through the real registry, drain it, and write
// small IDX / CIFAR-10 / CSV files (plain or gzip via zlib).
#pragma once
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/config.hpp"
#include "kiln/data.hpp"
#include "test_support.hpp"

namespace kiln::test::data {

// Forwards the calls every stage has to its upstream, and no more: random access (at, fill) stays hidden unless a
// test's stage adds it.
class Forwarding : public Stage {
 public:
  explicit Forwarding(std::unique_ptr<Stage> up) : up_(std::move(up)) {}
  std::optional<Element> next() override { return up_->next(); }
  void reset(uint64_t epoch) override { up_->reset(epoch); }
  Shape example_shape() const override { return up_->example_shape(); }
  Shape label_shape() const override { return up_->label_shape(); }
  int64_t size_hint() const override { return up_->size_hint(); }
  StageState save() const override { return up_->save(); }
  void restore(const StageState& s) override { up_->restore(s); }
  void collect_stats(std::vector<StageStats>& out) const override { up_->collect_stats(out); }

 protected:
  std::unique_ptr<Stage> up_;
};

// Hides its upstream's random access, so the stages after it run their streaming code (the reference the
// random-access paths must equal).
class Streaming final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  std::string name() const override { return "streaming"; }
};

struct PipelineOptions {
  std::string base_dir;
  int64_t global_batch = 0;
  uint64_t seed = 42;
  std::string pipeline;                  // "train" / "test" as in a run's [data.<which>]; "" outside one
  int64_t rows_begin = 0, rows_end = 0;  // StageContext's row share (0, 0: every row)
  uint64_t decoded_budget = 0;           // [data] decoded_budget (0: sources stream)
};

// Builds the stages of `stages_toml` ("stages = [...]") one by one after `cur` (null: the first is a source), as
// the host does.
inline std::unique_ptr<Stage> add_stages(std::unique_ptr<Stage> cur, const std::string& stages_toml,
                                         const PipelineOptions& o = {}) {
  Config cfg = Config::load_string(stages_toml, "pipeline.toml");
  for (auto& s : cfg.root().table_array("stages")) {
    std::string type = s.get_string("type");
    StageContext ctx;
    ctx.upstream = std::move(cur);
    ctx.base_dir = o.base_dir;
    ctx.global_batch = o.global_batch;
    ctx.seed = o.seed;
    ctx.pipeline = o.pipeline;
    ctx.rows_begin = o.rows_begin;
    ctx.rows_end = o.rows_end;
    ctx.decoded_budget = o.decoded_budget;
    cur = registry().stage(type)(s, std::move(ctx));
  }
  return cur;
}

// Builds `stages = [...]` (a TOML snippet) stage by stage, exactly as the host does.
inline std::unique_ptr<Stage> build(const std::string& stages_toml, const PipelineOptions& o = {}) {
  return add_stages(nullptr, stages_toml, o);
}

inline std::vector<Element> drain(Stage& s, size_t max = SIZE_MAX) {
  std::vector<Element> out;
  while (out.size() < max) {
    auto e = s.next();
    if (!e) break;
    out.push_back(std::move(*e));
  }
  return out;
}

inline std::vector<Element> epoch(Stage& s, uint64_t e) {
  s.reset(e);
  return drain(s);
}

inline bool same(const Element& a, const Element& b) {
  return a.batch == b.batch && a.x.shape == b.x.shape && a.y.shape == b.y.shape && a.x.data == b.x.data &&
         a.y.data == b.y.data;
}

inline bool same(const std::vector<Element>& a, const std::vector<Element>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

// Labels of a stream of single examples or batches, flattened.
inline std::vector<float> labels(const std::vector<Element>& es) {
  std::vector<float> out;
  for (auto& e : es) out.insert(out.end(), e.y.data.begin(), e.y.data.end());
  return out;
}

inline StageStats stats_of(const Stage& s, const std::string& name) {
  std::vector<StageStats> all;
  s.collect_stats(all);
  for (auto& st : all)
    if (st.name == name) return st;
  return {};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& bytes, bool gzip = false) {
  if (gzip) {
    gzFile f = gzopen(p.string().c_str(), "wb6");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// Pixel (i, r, c) of the test images: a value that identifies the example and the position.
inline uint8_t pixel(uint32_t i, uint32_t r, uint32_t c) { return static_cast<uint8_t>((i * 7 + r * 3 + c) % 256); }
inline uint8_t label_of(uint32_t i) { return static_cast<uint8_t>((i * 3 + 1) % 10); }

inline std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b;
  put_be32(b, 0x00000803);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t r = 0; r < rows; ++r)
      for (uint32_t c = 0; c < cols; ++c) b.push_back(pixel(i, r, c));
  return b;
}

inline std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> b;
  put_be32(b, 0x00000801);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(label_of(i));
  return b;
}

// Writes images/labels of n examples (rows x cols) under dir; returns the stage TOML for them.
inline std::string write_idx(const std::filesystem::path& dir, uint32_t n, uint32_t rows = 4, uint32_t cols = 5,
                             bool gzip = false) {
  std::string ext = gzip ? ".gz" : "";
  write_bytes(dir / ("images" + ext), idx_images(n, rows, cols), gzip);
  write_bytes(dir / ("labels" + ext), idx_labels(n), gzip);
  return "{type = \"idx\", images = \"" + (dir / ("images" + ext)).string() + "\", labels = \"" +
         (dir / ("labels" + ext)).string() + "\"}";
}

}  // namespace kiln::test::data
