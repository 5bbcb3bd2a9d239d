#include "common.hpp"

#include <cmath>
#include <filesystem>

#include "kiln/allocator.hpp"

namespace kiln::data {

std::string resolve_path(const std::string& base_dir, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_absolute() || base_dir.empty()) return p.string();
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

void StateWriter::put(const void* p, size_t n) {
  auto b = static_cast<const uint8_t*>(p);
  out_.insert(out_.end(), b, b + n);
}

void StateWriter::tag(const std::string& stage, uint32_t version) {
  str(stage);
  u64(version);
}

void StateWriter::str(const std::string& s) {
  u64(s.size());
  put(s.data(), s.size());
}

void StateWriter::blob(const StageState& s) {
  u64(s.size());
  put(s.data(), s.size());
}

void StateWriter::element(const Element& e) {
  i64(e.batch);
  for (const HostTensor* t : {&e.x, &e.y}) {
    u64(t->shape.rank());
    for (auto d : t->shape.dims()) i64(d);
    u64(t->data.size());
    put(t->data.data(), t->bytes());
  }
}

StateReader::StateReader(const StageState& s, const std::string& stage, uint32_t version) : s_(s), stage_(stage) {
  std::string found = str();
  if (found != stage)
    fail("the saved state belongs to stage '" + found + "', not '" + stage +
         "': the pipeline must have the same stages, in the same order, as when it was saved");
  uint64_t v = u64();
  if (v != version)
    fail("saved state has format version " + std::to_string(v) + ", this build reads version " +
         std::to_string(version));
}

void StateReader::fail(const std::string& what) const {
  throw DataError("restore of data stage '" + stage_ + "': " + what);
}

void StateReader::get(void* p, size_t n) {
  if (n > s_.size() - pos_)
    fail("saved state is truncated (needed " + std::to_string(n) + " bytes at offset " + std::to_string(pos_) + ", " +
         std::to_string(s_.size() - pos_) + " left)");
  std::memcpy(p, s_.data() + pos_, n);
  pos_ += n;
}

std::string StateReader::str() {
  uint64_t n = u64();
  if (n > s_.size() - pos_) fail("saved state is truncated (string of " + std::to_string(n) + " bytes)");
  std::string s(reinterpret_cast<const char*>(s_.data() + pos_), n);
  pos_ += n;
  return s;
}

StageState StateReader::blob() {
  uint64_t n = u64();
  if (n > s_.size() - pos_) fail("saved state is truncated (nested state of " + std::to_string(n) + " bytes)");
  StageState b(s_.begin() + static_cast<std::ptrdiff_t>(pos_), s_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
  pos_ += n;
  return b;
}

Element StateReader::element() {
  Element e;
  e.batch = i64();
  for (HostTensor* t : {&e.x, &e.y}) {
    uint64_t rank = u64();
    if (rank > 16) fail("saved element has rank " + std::to_string(rank));
    std::vector<int64_t> dims(rank);
    for (auto& d : dims) d = i64();
    t->shape = Shape(std::move(dims));
    uint64_t n = u64();
    if (static_cast<int64_t>(n) != t->shape.numel() || n * sizeof(float) > s_.size() - pos_)
      fail("saved element of shape " + t->shape.str() + " has " + std::to_string(n) + " values");
    t->data.resize(n);
    get(t->data.data(), n * sizeof(float));
  }
  return e;
}

void StateReader::done() const {
  if (pos_ != s_.size()) fail("saved state has " + std::to_string(s_.size() - pos_) + " unexpected trailing bytes");
}

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

float CounterRng::normal() {  // Box-Muller; one value per call keeps draws independent of call pairing
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

Element stack_examples(std::vector<Element>& examples, const std::string& stage) {
  Element out;
  if (examples.empty()) return out;
  const Shape xs = examples[0].x.shape, ys = examples[0].y.shape;
  const auto n = static_cast<int64_t>(examples.size());
  out.batch = n;
  out.x = HostTensor(xs.with_batch(n));
  out.y = HostTensor(ys.with_batch(n));
  const size_t xn = examples[0].x.data.size(), yn = examples[0].y.data.size();
  for (size_t i = 0; i < examples.size(); ++i) {
    const Element& e = examples[i];
    if (e.batch != 0)
      throw DataError("data stage '" + stage + "': expected single examples from upstream, got a batch of " +
                      std::to_string(e.batch) + " (is there a second batch stage?)");
    if (!(e.x.shape == xs) || !(e.y.shape == ys))
      throw DataError("data stage '" + stage + "': example " + std::to_string(i) + " of the batch has shapes x " +
                      e.x.shape.str() + ", y " + e.y.shape.str() + "; the first had x " + xs.str() + ", y " + ys.str());
    std::memcpy(out.x.data.data() + i * xn, e.x.data.data(), xn * sizeof(float));
    std::memcpy(out.y.data.data() + i * yn, e.y.data.data(), yn * sizeof(float));
  }
  return out;
}

std::vector<Element> split_examples(Element e) {
  std::vector<Element> out;
  if (e.batch == 0) {
    out.push_back(std::move(e));
    return out;
  }
  const Shape xs = e.x.shape.tail(), ys = e.y.shape.tail();
  const size_t xn = static_cast<size_t>(xs.numel()), yn = static_cast<size_t>(ys.numel());
  out.reserve(static_cast<size_t>(e.batch));
  for (int64_t i = 0; i < e.batch; ++i) {
    Element one;
    one.x.shape = xs;
    one.y.shape = ys;
    auto xb = e.x.data.begin() + static_cast<std::ptrdiff_t>(i * xn);
    auto yb = e.y.data.begin() + static_cast<std::ptrdiff_t>(i * yn);
    one.x.data.assign(xb, xb + static_cast<std::ptrdiff_t>(xn));
    one.y.data.assign(yb, yb + static_cast<std::ptrdiff_t>(yn));
    out.push_back(std::move(one));
  }
  return out;
}

StageState save_position(const std::string& stage, uint64_t pos) {
  StateWriter w;
  w.tag(stage, 1);
  w.u64(pos);
  return w.take();
}

uint64_t restore_position(const StageState& s, const std::string& stage, uint64_t count, const std::string& of_what) {
  StateReader r(s, stage, 1);
  const uint64_t pos = r.u64();
  r.done();
  if (pos > count)
    r.fail("saved position " + std::to_string(pos) + " is past the " + std::to_string(count) + " " + of_what);
  return pos;
}

ReadingPlan plan_reading(uint64_t decoded_bytes, uint64_t budget) {
  ReadingPlan p;
  const std::string set = format_bytes(static_cast<size_t>(decoded_bytes));
  if (budget == 0) {
    p.phrase = "streaming: decoding once is off ([data] decoded_budget = \"off\"; decoded set " + set + ")";
  } else if (decoded_bytes > budget) {
    p.phrase = "streaming: decoded set " + set + " exceeds the budget " + format_bytes(static_cast<size_t>(budget)) +
               " ([data] decoded_budget)";
  } else {
    p.decoded = true;
    p.phrase = "decoded once: " + set + " in memory (budget " + format_bytes(static_cast<size_t>(budget)) + ")";
  }
  return p;
}

void bytes_to_floats(const uint8_t* bytes, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = bytes[i];
}
void bytes_to_floats_scaled(const uint8_t* bytes, size_t n, float factor, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(bytes[i]) * factor;
}

Element byte_example(const uint8_t* pixels, const Shape& shape, float label) {
  Element e;
  e.x = HostTensor(shape);
  bytes_to_floats(pixels, e.x.data.size(), e.x.data.data());
  e.y = HostTensor(Shape{}, label);
  return e;
}

}  // namespace kiln::data
