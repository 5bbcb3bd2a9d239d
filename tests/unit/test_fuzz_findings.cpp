// What the libFuzzer harnesses (tests/fuzz) found, each kept as a regular test: the input that crashed Kiln is
// rebuilt here and must now be a clean error (DataError naming the file). The raw input also stays in the harness's
// kept corpus (tests/fuzz/corpus/<harness>/crash-*), which every fuzz run replays first.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kiln/checkpoint.hpp"
#include "kiln/config.hpp"
#include "kiln/error.hpp"
#include "kiln/session.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Writes `bytes` as a version-1 checkpoint file (KILNCKP1, still read) with a correct trailing checksum (FNV-1a 64, as
// checkpoint.cpp computes it for that version), so the damage reaches the parser instead of failing the checksum.
std::string write_checkpoint(const fs::path& p, std::string bytes) {
  bytes.replace(0, 8, "KILNCKP1");
  uint64_t h = 1469598103934665603ull;
  for (char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  bytes.append(reinterpret_cast<const char*>(&h), 8);
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

// A valid checkpoint (one tensor "w" of shape (2, 3), data state "state") without its checksum, and the byte
// offsets of its fields.
struct Layout {
  std::string bytes;
  size_t data_state_len = 8 + 8 + 8;         // after magic, epoch, step
  size_t dims = 24 + 8 + 5 + 8 + 4 + 1 + 4;  // ... data state, count, name length, "w", rank
};

Layout valid_checkpoint(const fs::path& dir) {
  kiln::Checkpoint c;
  c.epoch = 2;
  c.step = 40;
  c.data_state = {'s', 't', 'a', 't', 'e'};
  c.tensors.emplace("w", kiln::HostTensor(kiln::Shape{2, 3}, 0.5f));
  kiln::save_checkpoint((dir / "valid.kiln").string(), c);
  Layout l;
  l.bytes = read(dir / "valid.kiln");
  l.bytes.resize(l.bytes.size() - 8);
  return l;
}

std::string load_error(const std::string& path) {
  try {
    kiln::load_checkpoint(path);
  } catch (const kiln::DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("fuzz finding: a checkpoint tensor whose shape asks for exabytes is a DataError, not an allocation",
          "[fuzz-findings]") {
  // kiln_fuzz_checkpoint: dims (2, 0xcc000000...) made load_checkpoint allocate the tensor before checking the file
  // holds its bytes; ASan stopped it as out-of-memory (corpus/checkpoint/crash-huge-shape.bin).
  auto dir = kiln::test::temp_dir("fuzz-ckpt");
  Layout l = valid_checkpoint(dir);
  REQUIRE(kiln::load_checkpoint(write_checkpoint(dir / "ok.kiln", l.bytes)).tensors.at("w").data.size() == 6);

  std::string huge = l.bytes;
  const int64_t big = int64_t{1} << 40;
  std::memcpy(huge.data() + l.dims + 8, &big, 8);
  auto msg = load_error(write_checkpoint(dir / "huge.kiln", huge));
  CHECK_THAT(msg, Catch::Contains("tensor 'w'") && Catch::Contains("needs more bytes than the file holds"));

  std::string negative = l.bytes;
  const int64_t minus = -3;
  std::memcpy(negative.data() + l.dims, &minus, 8);
  msg = load_error(write_checkpoint(dir / "negative.kiln", negative));
  CHECK_THAT(msg, Catch::Contains("tensor 'w'") && Catch::Contains("is not a valid shape"));

  std::string overflow = l.bytes;
  const int64_t half = int64_t{1} << 62;
  std::memcpy(overflow.data() + l.dims, &half, 8);
  std::memcpy(overflow.data() + l.dims + 8, &half, 8);
  msg = load_error(write_checkpoint(dir / "overflow.kiln", overflow));
  CHECK_THAT(msg, Catch::Contains("is not a valid shape"));
  fs::remove_all(dir);
}

// Found while writing kiln_fuzz_checkpoint (reading the reader), not by the fuzzer: pos + n in the bounds check
// wrapped for a length near 2^64, and the data state was then copied from far outside the file.
TEST_CASE("a checkpoint length near 2^64 does not wrap the bounds check", "[fuzz-findings]") {
  auto dir = kiln::test::temp_dir("fuzz-ckpt-wrap");
  Layout l = valid_checkpoint(dir);
  std::string wrap = l.bytes;
  const uint64_t len = ~uint64_t{0} - 16;  // pos + len wraps past 2^64 to just below pos
  std::memcpy(wrap.data() + l.data_state_len, &len, 8);
  auto msg = load_error(write_checkpoint(dir / "wrap.kiln", wrap));
  CHECK_THAT(msg, Catch::Contains("checkpoint truncated at byte 32"));
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint is refused when its fields run into the checksum, repeat a tensor or leave bytes over",
          "[fuzz-findings]") {
  auto dir = kiln::test::temp_dir("fuzz-ckpt-tail");
  Layout l = valid_checkpoint(dir);
  // The last tensor's data cut by 4 bytes: before, the reader took the first 4 checksum bytes as data.
  std::string cut = l.bytes.substr(0, l.bytes.size() - 4);
  CHECK_THAT(load_error(write_checkpoint(dir / "cut.kiln", cut)),
             Catch::Contains("tensor 'w' at byte 50 has shape (2, 3), which needs more bytes than the file holds"));

  CHECK_THAT(load_error(write_checkpoint(dir / "extra.kiln", l.bytes + "xyz")),
             Catch::Contains("3 unexpected bytes after its last tensor"));

  // The same tensor twice (count 2): the second silently replaced nothing before.
  std::string twice = l.bytes;
  const size_t count_at = 24 + 8 + 5;
  const uint64_t two = 2;
  std::memcpy(twice.data() + count_at, &two, 8);
  twice += l.bytes.substr(count_at + 8);
  CHECK_THAT(load_error(write_checkpoint(dir / "twice.kiln", twice)), Catch::Contains("holds tensor 'w' twice"));
  fs::remove_all(dir);
}

TEST_CASE("fuzz finding: a checkpoint tensor with no elements loads (no memcpy from a null pointer)",
          "[fuzz-findings]") {
  // kiln_fuzz_checkpoint under UBSan: a tensor of shape (2, 0) has no data, and load_checkpoint passed its null
  // data() to memcpy, which is undefined even for 0 bytes (corpus/checkpoint/crash-empty-tensor-memcpy.bin).
  auto dir = kiln::test::temp_dir("fuzz-ckpt-empty");
  kiln::Checkpoint c;
  c.tensors.emplace("empty", kiln::HostTensor(kiln::Shape{2, 0}));
  c.tensors.emplace("w", kiln::HostTensor(kiln::Shape{3}, 1.5f));
  kiln::save_checkpoint((dir / "c.kiln").string(), c);
  auto back = kiln::load_checkpoint((dir / "c.kiln").string());
  CHECK(back.tensors.at("empty").shape == kiln::Shape({2, 0}));
  CHECK(back.tensors.at("empty").data.empty());
  CHECK(back.tensors.at("w").data == std::vector<float>{1.5f, 1.5f, 1.5f});
  fs::remove_all(dir);
}

// fuzz_session found a layer count written as a float too large for any integer (tests/fuzz/corpus/session/
// crash-filters-1e24.toml: `filters = 1E24`): ConfigNode::get_int converted it to int64 before comparing, which is
// undefined behaviour (UBSan). Now it is a ConfigError naming the file, line and key.
TEST_CASE("fuzz finding: filters = 1E24 is a ConfigError naming the key, not a float-to-integer conversion",
          "[fuzz-findings]") {
  const std::string cfg =
      "[model]\ninput_shape = [1, 8, 8]\n[[model.layers]]\ntype = \"conv2d\"\nfilters = 1E24\nkernel = 3\n";
  std::string msg = "(no error)";
  try {
    kiln::Session s(kiln::Config::load_string(cfg, "f.toml"), kiln::test::registry());
  } catch (const kiln::ConfigError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains("f.toml:5"));
  CHECK_THAT(msg, Catch::Contains("filters"));
  CHECK_THAT(msg, Catch::Contains("outside the 64-bit integer range"));
}
