// Helpers shared by the data stages: saved-state encoding, counter-based randomness, timing, element
// stacking, path resolution.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/data.hpp"
#include "kiln/error.hpp"

namespace kiln::data {

// A path as given in the config, resolved against the config's directory when relative.
std::string resolve_path(const std::string& base_dir, const std::string& path);

// Appends typed fields to a StageState. Every stage starts its state with tag(name(), version).
class StateWriter {
 public:
  void tag(const std::string& stage, uint32_t version);
  void u64(uint64_t v) { put(&v, sizeof v); }
  void i64(int64_t v) { put(&v, sizeof v); }
  void f64(double v) { put(&v, sizeof v); }
  void str(const std::string& s);
  void blob(const StageState& s);  // a nested state (the upstream's)
  void element(const Element& e);
  StageState take() { return std::move(out_); }

 private:
  void put(const void* p, size_t n);
  StageState out_;
};

// Reads what StateWriter wrote; any mismatch or short read is a DataError naming the stage.
class StateReader {
 public:
  StateReader(const StageState& s, const std::string& stage, uint32_t version);
  uint64_t u64() {
    uint64_t v;
    get(&v, sizeof v);
    return v;
  }
  int64_t i64() {
    int64_t v;
    get(&v, sizeof v);
    return v;
  }
  double f64() {
    double v;
    get(&v, sizeof v);
    return v;
  }
  std::string str();
  StageState blob();
  Element element();
  void done() const;  // throws if bytes are left over
  [[noreturn]] void fail(const std::string& what) const;

 private:
  void get(void* p, size_t n);
  const StageState& s_;
  std::string stage_;
  size_t pos_ = 0;
};

// The state of a stage whose whole position is one counter (sources, the cache): tag(stage, 1) and the counter.
StageState save_position(const std::string& stage, uint64_t pos);
// Reads it back. A position past `count` is a DataError naming the stage, `count` and `of_what` ("records of
// data_batch_1.bin").
uint64_t restore_position(const StageState& s, const std::string& stage, uint64_t count, const std::string& of_what);

// Stateless randomness: every draw is a hash of (key, counter), so results do not depend on which thread
// draws or in which order elements are processed.
uint64_t mix64(uint64_t x);
inline uint64_t hash_key(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a ^ 0x9e3779b97f4a7c15ULL) ^ b) ^ c) ^ d);
}

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t next_u64() { return mix64(key_ ^ mix64(++counter_)); }
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
  float normal();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Adds the elapsed wall time to `acc` when it goes out of scope.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& acc_;
  std::chrono::steady_clock::time_point t0_;
};

// Number of examples in an element (1 for a single example).
inline int64_t example_count(const Element& e) { return e.batch > 0 ? e.batch : 1; }
// Stacks single examples into one batch element; throws DataError (naming `stage`) on shape mismatch.
Element stack_examples(std::vector<Element>& examples, const std::string& stage);
// The examples of a batch element (a single example is returned as is).
std::vector<Element> split_examples(Element e);

// How a source reads its files. A source whose decoded examples (in a compact form: pixel bytes, token ids, CSV
// values as floats) take at most `budget` bytes ([data] decoded_budget, StageContext::decoded_budget) keeps them in
// memory, decoded once per run at its first read, and serves every epoch from there; otherwise it streams.
struct ReadingPlan {
  bool decoded = false;
  std::string phrase;  // what Stage::reading() says
};
ReadingPlan plan_reading(uint64_t decoded_bytes, uint64_t budget);

// A single example of pixel bytes: x `shape` holding them as floats 0..255, y () the label.
Element byte_example(const uint8_t* pixels, const Shape& shape, float label);
// Pixel bytes 0..255 as floats (byte_example's x, and a source's fill()).
void bytes_to_floats(const uint8_t* bytes, size_t n, float* out);
// The same times `factor` in the same pass: float(byte) * factor, the bits of bytes_to_floats then a scale op.
void bytes_to_floats_scaled(const uint8_t* bytes, size_t n, float factor, float* out);

// The counters of a source that next() and at() (from any thread) update; collect_stats reports them.
struct SourceCounters {
  std::atomic<uint64_t> elements{0};
  std::atomic<uint64_t> bytes{0};  // every byte read from the files (uncompressed, for gzip)
  double busy_seconds = 0;         // next()'s own work (at() runs on its callers' threads)
  void report(const std::string& name, std::vector<StageStats>& out) const {
    StageStats s;
    s.name = name;
    s.elements = elements.load(std::memory_order_relaxed);
    s.bytes_read = bytes.load(std::memory_order_relaxed);
    s.busy_seconds = busy_seconds;
    out.push_back(s);
  }
};

}  // namespace kiln::data
